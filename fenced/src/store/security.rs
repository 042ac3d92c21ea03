//! TLS and credentials of every etcd connection: the store's own client, the health
//! probe's per-endpoint clients and the operator commands all build their
//! [`ConnectOptions`] through [`EtcdSecurity::apply`], so they present the same
//! certificate and user.
//!
//! TLS is rustls with ring (etcd-client's `tls` feature: no system OpenSSL). An
//! `https://` endpoint's certificate is verified against `--etcd-ca` (else the system
//! CA store) and must name the endpoint's host. The files are read and parsed here,
//! before any connection, so a missing or unparsable file is one error naming it; a
//! handshake refused by either side is classified [`StoreError::Tls`] (not retried).
//!
//! Authentication: a client certificate alone, when etcd runs with
//! `--client-cert-auth` (the certificate's CN is the etcd user), or a user and
//! password. etcd's tokens expire (`--auth-token-ttl`, and a restarted member forgets
//! its simple tokens); the client re-authenticates and retries once when etcd answers
//! "invalid auth token" (`with_auto_token_refresh`).

use std::path::{Path, PathBuf};

use etcd_client::{Certificate, ConnectOptions, Identity, TlsOptions};
use rustls_pki_types::pem::PemObject;
use rustls_pki_types::{CertificateDer, PrivateKeyDer};

/// The TLS files and the credentials of the etcd connections.
#[derive(Clone, Default, PartialEq, Eq)]
pub struct EtcdSecurity {
    /// CA bundle (PEM) that verifies the servers; `None`: the system CA store.
    pub ca: Option<PathBuf>,
    /// Client certificate (PEM), presented to etcd; with `--client-cert-auth` its CN
    /// is the etcd user when no `user` is given.
    pub cert: Option<PathBuf>,
    /// The client certificate's private key (PEM).
    pub key: Option<PathBuf>,
    /// etcd user (password authentication).
    pub user: Option<String>,
    /// File whose first line is the user's password (read when connecting; wins
    /// over `password`).
    pub password_file: Option<PathBuf>,
    /// The user's password (never logged: `Debug` shows it redacted).
    pub password: Option<String>,
}

impl std::fmt::Debug for EtcdSecurity {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("EtcdSecurity")
            .field("ca", &self.ca)
            .field("cert", &self.cert)
            .field("key", &self.key)
            .field("user", &self.user)
            .field("password_file", &self.password_file)
            .field("password", &self.password.as_ref().map(|_| "<redacted>"))
            .finish()
    }
}

/// A TLS file or credential that cannot be used; raised before anything connects.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum SecurityError {
    /// A file could not be read.
    #[error("cannot read {what} {}: {source}", path.display())]
    Read {
        /// Which file ("CA bundle (--etcd-ca)", ...).
        what: &'static str,
        /// Its path.
        path: PathBuf,
        /// The OS error.
        #[source]
        source: std::io::Error,
    },
    /// A file is not what it should be.
    #[error("{what} {} is not usable: {why}", path.display())]
    Parse {
        /// Which file.
        what: &'static str,
        /// Its path.
        path: PathBuf,
        /// What is wrong with it.
        why: String,
    },
    /// The settings do not fit together.
    #[error("{0}")]
    Settings(String),
}

impl EtcdSecurity {
    /// Whether any TLS file is configured.
    pub fn has_tls_files(&self) -> bool {
        self.ca.is_some() || self.cert.is_some() || self.key.is_some()
    }

    /// The identity etcd authenticates this connection as: the user, else the client
    /// certificate's CN (etcd's `--client-cert-auth` identity); `None` when neither is
    /// configured or the certificate cannot be read.
    pub fn identity(&self) -> Option<String> {
        if let Some(u) = &self.user {
            return Some(u.clone());
        }
        let pem = std::fs::read(self.cert.as_ref()?).ok()?;
        let cert = CertificateDer::pem_slice_iter(&pem).next()?.ok()?;
        der::common_name(cert.as_ref())
    }

    /// What the connection presents and trusts, for error messages: "CA bundle
    /// /etc/fenced/ca.pem, client certificate ..., user ...".
    pub fn describe(&self) -> String {
        let mut parts = Vec::new();
        match &self.ca {
            Some(p) => parts.push(format!("CA bundle {} (--etcd-ca)", p.display())),
            None => parts.push("the system CA store (no --etcd-ca)".to_owned()),
        }
        match &self.cert {
            Some(p) => parts.push(format!("client certificate {} (--etcd-cert)", p.display())),
            None => parts.push("no client certificate (no --etcd-cert)".to_owned()),
        }
        if let Some(p) = &self.key {
            parts.push(format!("key {} (--etcd-key)", p.display()));
        }
        if let Some(u) = &self.user {
            parts.push(format!("etcd user {u:?} (--etcd-user)"));
        }
        parts.join(", ")
    }

    /// Adds TLS (for `https://` endpoints) and credentials to `copts`. Reads and
    /// parses the files; refuses TLS files with `http://` endpoints (they would be
    /// ignored: plaintext where TLS was meant) and a mix of both schemes.
    pub fn apply(
        &self,
        endpoints: &[String],
        copts: ConnectOptions,
    ) -> Result<ConnectOptions, SecurityError> {
        let https = endpoints.iter().filter(|e| is_https(e)).count();
        let mut copts = copts;
        if https > 0 && https < endpoints.len() {
            return Err(SecurityError::Settings(format!(
                "etcd endpoints {} mix https:// and plaintext: use https:// for all of them",
                endpoints.join(",")
            )));
        }
        if https == 0 && self.has_tls_files() {
            return Err(SecurityError::Settings(format!(
                "--etcd-ca/--etcd-cert/--etcd-key given but the etcd endpoints {} are not https://: write them as https://host:port",
                endpoints.join(",")
            )));
        }
        if https > 0 {
            copts = copts.with_tls(self.tls_options()?);
        }
        let password = match &self.password_file {
            Some(path) => {
                let text = read("etcd password file (--etcd-password-file)", path)?;
                let text = String::from_utf8(text).map_err(|_| SecurityError::Parse {
                    what: "etcd password file (--etcd-password-file)",
                    path: path.clone(),
                    why: "not UTF-8 text".to_owned(),
                })?;
                Some(text.lines().next().unwrap_or_default().to_owned())
            }
            None => self.password.clone(),
        };
        match (&self.user, &password) {
            (Some(user), Some(password)) => {
                copts = copts
                    .with_user(user.clone(), password.clone())
                    .with_auto_token_refresh(true);
            }
            (Some(user), None) => {
                return Err(SecurityError::Settings(format!(
                    "etcd user {user:?} has no password: give --etcd-password-file (or FENCED_ETCD_PASSWORD), or drop --etcd-user to authenticate by client certificate"
                )));
            }
            (None, Some(_)) => {
                return Err(SecurityError::Settings(
                    "an etcd password is set (--etcd-password-file or FENCED_ETCD_PASSWORD) without --etcd-user".to_owned(),
                ));
            }
            (None, None) => {}
        }
        Ok(copts)
    }

    fn tls_options(&self) -> Result<TlsOptions, SecurityError> {
        let mut tls = TlsOptions::new();
        match &self.ca {
            Some(path) => {
                let (pem, _) = read_certificates("CA bundle (--etcd-ca)", path)?;
                tls = tls.ca_certificate(Certificate::from_pem(pem));
            }
            None => tls = tls.with_native_roots(),
        }
        match (&self.cert, &self.key) {
            (Some(cert), Some(key)) => {
                let (cert_pem, certs) =
                    read_certificates("client certificate (--etcd-cert)", cert)?;
                for c in &certs {
                    check_validity("client certificate (--etcd-cert)", cert, c)?;
                }
                let key_pem = read("client key (--etcd-key)", key)?;
                PrivateKeyDer::from_pem_slice(&key_pem)
                    .map_err(|e| parse_error("client key (--etcd-key)", key, &e))?;
                tls = tls.identity(Identity::from_pem(cert_pem, key_pem));
            }
            (Some(cert), None) => {
                return Err(SecurityError::Settings(format!(
                    "client certificate {} (--etcd-cert) given without its key: add --etcd-key",
                    cert.display()
                )));
            }
            (None, Some(key)) => {
                return Err(SecurityError::Settings(format!(
                    "client key {} (--etcd-key) given without its certificate: add --etcd-cert",
                    key.display()
                )));
            }
            (None, None) => {}
        }
        Ok(tls)
    }
}

/// Refuses a certificate outside its validity period, naming the file: etcd would
/// refuse the handshake, and under TLS 1.3 the client sees that only as a closed
/// connection, indistinguishable from a server going away (which is retried).
fn check_validity(
    what: &'static str,
    path: &Path,
    cert: &CertificateDer<'_>,
) -> Result<(), SecurityError> {
    let Some((not_before, not_after)) = der::validity(cert.as_ref()) else {
        return Err(SecurityError::Parse {
            what,
            path: path.to_owned(),
            why: "not an X.509 certificate (its validity period does not decode)".to_owned(),
        });
    };
    let now = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| i64::try_from(d.as_secs()).unwrap_or(i64::MAX));
    let why = if now > not_after {
        format!("expired {} (UTC; renew it)", der::show(not_after))
    } else if now < not_before {
        format!(
            "not valid before {} (UTC; check this host's clock)",
            der::show(not_before)
        )
    } else {
        return Ok(());
    };
    Err(SecurityError::Parse {
        what,
        path: path.to_owned(),
        why,
    })
}

/// Just enough DER to read a certificate's validity period.
mod der {
    use crate::clock::{civil_from_days, days_from_civil};

    /// One TLV at the start of `b`: (tag, contents, rest).
    fn tlv(b: &[u8]) -> Option<(u8, &[u8], &[u8])> {
        let (&tag, b) = b.split_first()?;
        let (&l0, mut b) = b.split_first()?;
        let len = if l0 < 0x80 {
            usize::from(l0)
        } else {
            let n = usize::from(l0 & 0x7f);
            if n == 0 || n > 4 || b.len() < n {
                return None;
            }
            let (lb, rest) = b.split_at(n);
            b = rest;
            lb.iter().fold(0usize, |a, &x| (a << 8) | usize::from(x))
        };
        (b.len() >= len).then(|| (tag, &b[..len], &b[len..]))
    }

    /// The fields of a certificate's TBSCertificate from `validity` on.
    fn from_validity(cert: &[u8]) -> Option<&[u8]> {
        let (0x30, cert, _) = tlv(cert)? else {
            return None;
        };
        let (0x30, tbs, _) = tlv(cert)? else {
            return None;
        };
        let mut rest = tbs;
        let (tag, _, r) = tlv(rest)?;
        if tag == 0xa0 {
            rest = r; // version
        }
        for _ in 0..3 {
            rest = tlv(rest)?.2; // serial, signature algorithm, issuer
        }
        Some(rest)
    }

    /// The subject's common name (OID 2.5.4.3).
    pub(super) fn common_name(cert: &[u8]) -> Option<String> {
        let after_validity = tlv(from_validity(cert)?)?.2;
        let (0x30, mut rdns, _) = tlv(after_validity)? else {
            return None;
        };
        while !rdns.is_empty() {
            let (_, set, r) = tlv(rdns)?;
            rdns = r;
            let (_, atv, _) = tlv(set)?;
            let (0x06, oid, value) = tlv(atv)? else {
                return None;
            };
            if oid == [0x55, 0x04, 0x03] {
                let (_, v, _) = tlv(value)?;
                return String::from_utf8(v.to_vec()).ok();
            }
        }
        None
    }

    /// (notBefore, notAfter) in Unix seconds.
    pub(super) fn validity(cert: &[u8]) -> Option<(i64, i64)> {
        let (0x30, validity, _) = tlv(from_validity(cert)?)? else {
            return None;
        };
        let (t1, v1, r) = tlv(validity)?;
        let (t2, v2, _) = tlv(r)?;
        Some((time(t1, v1)?, time(t2, v2)?))
    }

    /// UTCTime (0x17, YYMMDDHHMMSSZ) or GeneralizedTime (0x18, YYYYMMDDHHMMSSZ).
    fn time(tag: u8, v: &[u8]) -> Option<i64> {
        let s = std::str::from_utf8(v).ok()?.strip_suffix('Z')?;
        let (year, s) = match tag {
            0x17 => {
                let y: i64 = s.get(..2)?.parse().ok()?;
                (if y < 50 { 2000 + y } else { 1900 + y }, s.get(2..)?)
            }
            0x18 => (s.get(..4)?.parse().ok()?, s.get(4..)?),
            _ => return None,
        };
        let n = |i: usize| -> Option<i64> { s.get(i..i + 2)?.parse().ok() };
        let days = days_from_civil(year, n(0)?, n(2)?);
        Some(days * 86_400 + n(4)? * 3600 + n(6)? * 60 + n(8)?)
    }

    /// `YYYY-MM-DD HH:MM:SS` of Unix seconds.
    pub(super) fn show(t: i64) -> String {
        let (days, secs) = (t.div_euclid(86_400), t.rem_euclid(86_400));
        let (y, m, d) = civil_from_days(days);
        format!(
            "{y:04}-{m:02}-{d:02} {:02}:{:02}:{:02}",
            secs / 3600,
            secs % 3600 / 60,
            secs % 60
        )
    }

    #[cfg(test)]
    mod tests {
        #[test]
        fn dates_round_trip() {
            assert_eq!(super::time(0x17, b"010101000000Z"), Some(978_307_200));
            assert_eq!(super::time(0x18, b"20261201131415Z"), Some(1_796_130_855));
            assert_eq!(super::show(1_796_130_855), "2026-12-01 13:14:15");
            assert_eq!(super::show(978_307_200), "2001-01-01 00:00:00");
        }
    }
}

fn is_https(endpoint: &str) -> bool {
    endpoint
        .get(..8)
        .is_some_and(|s| s.eq_ignore_ascii_case("https://"))
}

/// Reads a PEM file that must hold at least one certificate: its bytes and the
/// certificates parsed from them.
fn read_certificates(
    what: &'static str,
    path: &Path,
) -> Result<(Vec<u8>, Vec<CertificateDer<'static>>), SecurityError> {
    let pem = read(what, path)?;
    let certs = CertificateDer::pem_slice_iter(&pem)
        .collect::<Result<Vec<_>, _>>()
        .map_err(|e| parse_error(what, path, &e))?;
    if certs.is_empty() {
        return Err(SecurityError::Parse {
            what,
            path: path.to_owned(),
            why: "no PEM certificate in it (expected -----BEGIN CERTIFICATE-----)".to_owned(),
        });
    }
    Ok((pem, certs))
}

fn read(what: &'static str, path: &Path) -> Result<Vec<u8>, SecurityError> {
    std::fs::read(path).map_err(|source| SecurityError::Read {
        what,
        path: path.to_owned(),
        source,
    })
}

fn parse_error(what: &'static str, path: &Path, e: &rustls_pki_types::pem::Error) -> SecurityError {
    let why = match e {
        rustls_pki_types::pem::Error::NoItemsFound => {
            "no PEM item of the expected kind in it".to_owned()
        }
        other => format!("not valid PEM ({other:?})"),
    };
    SecurityError::Parse {
        what,
        path: path.to_owned(),
        why,
    }
}

/// Whether a transport error's causes show a TLS failure (a certificate refused by
/// either side, a handshake alert, TLS spoken to a plaintext port). Such an error is
/// not retried: the same files fail the same way. tonic nests the rustls error in an
/// `io::Error` whose `source()` skips it, so the `Display` of every level is read.
pub(super) fn is_tls_failure(e: &(dyn std::error::Error + 'static)) -> bool {
    let mut cur = Some(e);
    while let Some(c) = cur {
        let t = c.to_string().to_ascii_lowercase();
        if t.contains("certificate")
            || t.contains("received fatal alert")
            || t.contains("invalidcontenttype")
            || t.contains("handshake")
            || t.contains("peer is incompatible")
        {
            return true;
        }
        cur = c.source();
    }
    false
}

#[cfg(test)]
mod tests {
    use super::*;

    /// `s` applied to `endpoints`, on fresh connect options.
    fn apply(s: &EtcdSecurity, endpoints: &[&str]) -> Result<ConnectOptions, SecurityError> {
        let endpoints: Vec<String> = endpoints.iter().map(|e| (*e).to_owned()).collect();
        s.apply(&endpoints, ConnectOptions::new())
    }

    /// Why `s` is refused for `endpoints`.
    fn refusal(s: &EtcdSecurity, endpoints: &[&str]) -> String {
        apply(s, endpoints).unwrap_err().to_string()
    }

    #[test]
    fn files_are_checked_before_connecting() {
        let dir = tempfile::tempdir().unwrap();
        let missing = dir.path().join("nope.pem");
        let s = EtcdSecurity {
            ca: Some(missing.clone()),
            ..EtcdSecurity::default()
        };
        let e = refusal(&s, &["https://127.0.0.1:2379"]);
        assert!(e.contains(&missing.display().to_string()), "{e}");
        assert!(e.contains("CA bundle"), "{e}");
        let junk = dir.path().join("junk.pem");
        std::fs::write(&junk, "not a certificate\n").unwrap();
        let s = EtcdSecurity {
            ca: Some(junk.clone()),
            ..EtcdSecurity::default()
        };
        let e = refusal(&s, &["https://127.0.0.1:2379"]);
        assert!(
            e.contains(&junk.display().to_string()) && e.contains("no PEM"),
            "{e}"
        );
    }

    #[test]
    fn settings_that_do_not_fit_are_refused() {
        let tls = EtcdSecurity {
            ca: Some("/x/ca.pem".into()),
            ..EtcdSecurity::default()
        };
        let e = refusal(&tls, &["http://127.0.0.1:2379"]);
        assert!(e.contains("not https://"), "{e}");
        let e = refusal(
            &EtcdSecurity::default(),
            &["https://a:2379", "http://b:2379"],
        );
        assert!(e.contains("mix https://"), "{e}");
        let user = EtcdSecurity {
            user: Some("n1".into()),
            ..EtcdSecurity::default()
        };
        let e = refusal(&user, &["http://127.0.0.1:2379"]);
        assert!(e.contains("has no password"), "{e}");
        let cert = EtcdSecurity {
            cert: Some("/x/c.pem".into()),
            ..EtcdSecurity::default()
        };
        let e = refusal(&cert, &["https://127.0.0.1:2379"]);
        assert!(e.contains("without its key"), "{e}");
        assert!(apply(&EtcdSecurity::default(), &["http://127.0.0.1:2379"]).is_ok());
    }

    #[test]
    fn identity_is_the_user_else_the_certificate_cn_and_expiry_is_checked() {
        let pki = test_support::tls::Pki::new("unit CA");
        let alice = pki.client("alice");
        let mut s = EtcdSecurity {
            ca: Some(pki.ca()),
            cert: Some(alice.cert.clone()),
            key: Some(alice.key.clone()),
            ..EtcdSecurity::default()
        };
        assert_eq!(s.identity().as_deref(), Some("alice"));
        assert!(apply(&s, &["https://127.0.0.1:2379"]).is_ok());
        s.user = Some("bob".into());
        assert_eq!(s.identity().as_deref(), Some("bob"));
        assert_eq!(EtcdSecurity::default().identity(), None);
        let old = pki.expired_client("alice");
        let s = EtcdSecurity {
            ca: Some(pki.ca()),
            cert: Some(old.cert.clone()),
            key: Some(old.key),
            ..EtcdSecurity::default()
        };
        let e = refusal(&s, &["https://127.0.0.1:2379"]);
        assert!(
            e.contains(&old.cert.display().to_string()) && e.contains("expired 2001-01-01"),
            "{e}"
        );
    }

    #[test]
    fn the_password_is_not_in_debug_output() {
        let s = EtcdSecurity {
            user: Some("n1".into()),
            password: Some("hunter2".into()),
            ..EtcdSecurity::default()
        };
        assert!(!format!("{s:?}").contains("hunter2"));
    }
}
