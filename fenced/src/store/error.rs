//! [`StoreError`]: every etcd-client error, classified once, here.

/// The client's error in words, for a one-line message: the OS cause when there is
/// one ("connection refused"), else the gRPC status's message. etcd-client's own text
/// of a transport failure is tonic's `Debug` output, not for an operator's eyes (the
/// error itself stays the `source`, for code that classifies it).
pub fn plain(e: &etcd_client::Error) -> String {
    let mut cur: Option<&(dyn std::error::Error + 'static)> = Some(e);
    while let Some(c) = cur {
        if let Some(io) = c.downcast_ref::<std::io::Error>() {
            return match io.kind() {
                std::io::ErrorKind::ConnectionRefused => {
                    "connection refused (nothing listens there)".to_owned()
                }
                std::io::ErrorKind::TimedOut => "connection timed out".to_owned(),
                _ => io.to_string(),
            };
        }
        cur = c.source();
    }
    // tonic's connect error does not expose its OS error as a source: only its
    // `Debug` text names the kind.
    let debug = format!("{e:?}");
    for (kind, words) in [
        (
            "kind: ConnectionRefused",
            "connection refused (nothing listens there)",
        ),
        ("kind: TimedOut", "connection timed out"),
        ("kind: ConnectionReset", "connection reset by the server"),
        ("kind: HostUnreachable", "host unreachable"),
        ("kind: NetworkUnreachable", "network unreachable"),
    ] {
        if debug.contains(kind) {
            return words.to_owned();
        }
    }
    match e {
        etcd_client::Error::GRpcStatus(s) if !s.message().is_empty() => s.message().to_owned(),
        etcd_client::Error::GRpcStatus(s) => s.code().description().to_owned(),
        other => other.to_string(),
    }
}

/// An etcd failure, classified once, here.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum StoreError {
    /// etcd could not be reached or did not answer in time (retry with backoff).
    #[error("etcd unavailable during {op}: {}", plain(source))]
    Unavailable {
        /// The operation.
        op: &'static str,
        /// The client's error.
        #[source]
        source: etcd_client::Error,
    },
    /// The requested revision has been compacted away.
    #[error("etcd revision compacted during {op}: {}", plain(source))]
    Compacted {
        /// The operation.
        op: &'static str,
        /// The client's error.
        #[source]
        source: etcd_client::Error,
    },
    /// The lease is gone (expired or revoked).
    #[error("etcd lease expired or not found during {op}: {}", plain(source))]
    LeaseGone {
        /// The operation.
        op: &'static str,
        /// The client's error.
        #[source]
        source: etcd_client::Error,
    },
    /// The TLS handshake failed: a certificate refused by either side (unknown
    /// issuer, expired, not valid for the host, no client certificate), or TLS spoken
    /// to a plaintext port. Not retried: the same files fail the same way.
    #[error(
        "etcd TLS handshake failed during {op}: {} (check --etcd-ca, --etcd-cert, --etcd-key and that the server certificate names the endpoint's host)",
        plain(source)
    )]
    Tls {
        /// The operation.
        op: &'static str,
        /// The client's error.
        #[source]
        source: etcd_client::Error,
    },
    /// etcd refused the credentials (wrong user or password, unknown certificate CN)
    /// or the user's roles do not grant the operation. Not retried.
    #[error(
        "etcd refused {op}: {} (check --etcd-user and the password, or the client certificate's CN, and the roles granted to that user: `fenced etcd-roles`)",
        plain(source)
    )]
    Denied {
        /// The operation.
        op: &'static str,
        /// The client's error.
        #[source]
        source: etcd_client::Error,
    },
    /// A TLS file or credential setting cannot be used (raised before connecting).
    #[error(transparent)]
    Security(#[from] super::security::SecurityError),
    /// Any other etcd error.
    #[error("etcd error during {op}: {}", plain(source))]
    Other {
        /// The operation.
        op: &'static str,
        /// The client's error.
        #[source]
        source: etcd_client::Error,
    },
    /// A stored value does not parse.
    #[error(
        "malformed value at {key}: {what} (repair or delete the key with etcdctl; `fenced status` lists every malformed record)"
    )]
    Malformed {
        /// The key.
        key: String,
        /// What is wrong.
        what: String,
    },
}

impl StoreError {
    /// Classifies an etcd-client error. etcd-client reports some conditions only as
    /// strings (lease keepalive) or as gRPC statuses with a message, so this is the one
    /// place that looks at them.
    pub fn classify(op: &'static str, source: etcd_client::Error) -> Self {
        use etcd_client::Error as E;
        use tonic::Code;
        match &source {
            E::TransportError(e) if super::security::is_tls_failure(e) => Self::Tls { op, source },
            E::IoError(e) if super::security::is_tls_failure(e) => Self::Tls { op, source },
            E::TransportError(_) | E::IoError(_) => Self::Unavailable { op, source },
            E::LeaseKeepAliveError(_) => Self::LeaseGone { op, source },
            E::GRpcStatus(s) => match s.code() {
                Code::Unavailable | Code::Unknown if super::security::is_tls_failure(s) => {
                    Self::Tls { op, source }
                }
                Code::Unauthenticated | Code::PermissionDenied => Self::Denied { op, source },
                Code::Unavailable | Code::DeadlineExceeded | Code::Cancelled | Code::Aborted => {
                    Self::Unavailable { op, source }
                }
                Code::Unknown if s.message().contains("transport") => {
                    Self::Unavailable { op, source }
                }
                Code::OutOfRange if s.message().contains("compacted") => {
                    Self::Compacted { op, source }
                }
                Code::NotFound if s.message().contains("lease not found") => {
                    Self::LeaseGone { op, source }
                }
                _ => Self::Other { op, source },
            },
            _ => Self::Other { op, source },
        }
    }

    /// An unreachable-looking failure that is a connection the server closed (broken
    /// pipe, reset, EOF) after accepting it: over TLS, how a server that refuses the
    /// client certificate (none, expired, another CA's) often shows under TLS 1.3,
    /// where the client finishes its handshake before the server's verdict arrives.
    pub fn is_closed_by_server(&self) -> bool {
        let Self::Unavailable { source, .. } = self else {
            return false;
        };
        let mut cur: Option<&(dyn std::error::Error + 'static)> = Some(source);
        while let Some(c) = cur {
            let t = c.to_string().to_ascii_lowercase();
            if t.contains("broken pipe")
                || t.contains("connection reset")
                || t.contains("unexpected eof")
                || t.contains("connection closed")
            {
                return true;
            }
            cur = c.source();
        }
        false
    }

    /// [`Self::is_closed_by_server`] seen on every attempt over TLS: taken as the
    /// handshake refused ([`Self::Tls`]), not retried.
    pub fn into_tls_refused(self) -> Self {
        match self {
            Self::Unavailable { op, source } => Self::Tls { op, source },
            e => e,
        }
    }

    /// Worth retrying with backoff.
    pub fn is_retryable(&self) -> bool {
        matches!(self, Self::Unavailable { .. })
    }

    /// The revision asked for was compacted.
    pub fn is_compacted(&self) -> bool {
        matches!(self, Self::Compacted { .. })
    }

    /// etcd refused the credentials or the operation (RBAC).
    pub fn is_denied(&self) -> bool {
        matches!(self, Self::Denied { .. })
    }

    /// The lease is gone.
    pub fn is_lease_gone(&self) -> bool {
        matches!(self, Self::LeaseGone { .. })
    }
}

#[cfg(test)]
pub(super) mod tests {
    use super::*;

    /// A gRPC status error as etcd-client reports it.
    pub(in crate::store) fn status(code: tonic::Code, msg: &str) -> etcd_client::Error {
        etcd_client::Error::GRpcStatus(tonic::Status::new(code, msg))
    }

    #[test]
    fn classification() {
        use tonic::Code;
        let e = StoreError::classify(
            "watch",
            status(
                Code::OutOfRange,
                "etcdserver: mvcc: required revision has been compacted",
            ),
        );
        assert!(e.is_compacted() && !e.is_retryable());
        let e = StoreError::classify(
            "txn",
            status(Code::Unavailable, "etcdserver: leader changed"),
        );
        assert!(e.is_retryable());
        let e = StoreError::classify(
            "txn",
            status(Code::DeadlineExceeded, "context deadline exceeded"),
        );
        assert!(e.is_retryable());
        let e = StoreError::classify(
            "lease_keep_alive",
            status(Code::NotFound, "etcdserver: requested lease not found"),
        );
        assert!(e.is_lease_gone());
        let e = StoreError::classify(
            "lease_keep_alive",
            etcd_client::Error::LeaseKeepAliveError("lease expired or revoked".into()),
        );
        assert!(e.is_lease_gone());
        let e = StoreError::classify(
            "txn",
            status(
                Code::InvalidArgument,
                "etcdserver: too many operations in txn request",
            ),
        );
        assert!(!e.is_retryable() && !e.is_compacted() && !e.is_lease_gone());
        assert!(e.to_string().starts_with("etcd error during txn"));
        let e = StoreError::classify(
            "txn",
            status(Code::PermissionDenied, "etcdserver: permission denied"),
        );
        assert!(e.is_denied() && !e.is_retryable());
        let e = StoreError::classify(
            "connect",
            status(
                Code::Unavailable,
                "error trying to connect: invalid peer certificate: UnknownIssuer",
            ),
        );
        assert!(matches!(e, StoreError::Tls { .. }) && !e.is_retryable());
    }
}
