//! Certificates for tests of TLS etcd, generated in-process with rcgen (ring): a CA,
//! a server certificate for `127.0.0.1`/`localhost`, client certificates whose CN is
//! the etcd user, and the broken variants the error-path tests need (expired, wrong
//! host, signed by another CA). Written as PEM files into a temp directory.

use std::path::{Path, PathBuf};

use rcgen::{
    BasicConstraints, Certificate, CertificateParams, DnType, ExtendedKeyUsagePurpose, IsCa,
    KeyPair, KeyUsagePurpose, date_time_ymd,
};

/// The files an etcd server needs: its certificate and key, and the CA that signs
/// client certificates.
#[derive(Debug, Clone)]
pub struct ServerFiles {
    /// Server certificate (PEM).
    pub cert: PathBuf,
    /// Its key (PEM).
    pub key: PathBuf,
    /// CA bundle (PEM) trusted for client certificates.
    pub ca: PathBuf,
}

/// A client certificate and key (PEM files).
#[derive(Debug, Clone)]
pub struct ClientFiles {
    /// Certificate (PEM).
    pub cert: PathBuf,
    /// Key (PEM).
    pub key: PathBuf,
}

/// A test CA and the directory its files are written to (removed on drop).
pub struct Pki {
    dir: tempfile::TempDir,
    ca: Certificate,
    ca_key: KeyPair,
    name: String,
}

impl std::fmt::Debug for Pki {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Pki")
            .field("name", &self.name)
            .field("dir", &self.dir.path())
            .finish_non_exhaustive()
    }
}

impl Pki {
    /// A new CA named `name` (its CN), with its certificate at [`Pki::ca`].
    ///
    /// # Panics
    /// When key generation or signing fails, or the temp dir cannot be written.
    pub fn new(name: &str) -> Self {
        let dir = tempfile::tempdir().expect("temp dir");
        let ca_key = KeyPair::generate().expect("CA key");
        let mut p = CertificateParams::new(Vec::<String>::new()).expect("CA params");
        p.is_ca = IsCa::Ca(BasicConstraints::Unconstrained);
        p.distinguished_name.push(DnType::CommonName, name);
        p.key_usages = vec![
            KeyUsagePurpose::KeyCertSign,
            KeyUsagePurpose::CrlSign,
            KeyUsagePurpose::DigitalSignature,
        ];
        let ca = p.self_signed(&ca_key).expect("self-sign the CA");
        std::fs::write(dir.path().join("ca.pem"), ca.pem()).expect("write ca.pem");
        Self {
            dir,
            ca,
            ca_key,
            name: name.to_owned(),
        }
    }

    /// The CA certificate (PEM file).
    pub fn ca(&self) -> PathBuf {
        self.dir.path().join("ca.pem")
    }

    /// The directory the files are in.
    pub fn dir(&self) -> &Path {
        self.dir.path()
    }

    /// A server certificate valid for `127.0.0.1` and `localhost`.
    pub fn server(&self) -> ServerFiles {
        self.server_for("server", &["127.0.0.1", "localhost"])
    }

    /// A server certificate valid only for `names` (DNS names or IP addresses), e.g.
    /// another host's, to test that the client checks the name.
    pub fn server_for(&self, file: &str, names: &[&str]) -> ServerFiles {
        let (cert, key) = self.issue(
            file,
            "etcd server",
            names,
            ExtendedKeyUsagePurpose::ServerAuth,
            None,
        );
        ServerFiles {
            cert,
            key,
            ca: self.ca(),
        }
    }

    /// A client certificate whose CN is `cn` (the etcd user under
    /// `--client-cert-auth`).
    pub fn client(&self, cn: &str) -> ClientFiles {
        let (cert, key) = self.issue(
            &format!("client-{cn}"),
            cn,
            &[],
            ExtendedKeyUsagePurpose::ClientAuth,
            None,
        );
        ClientFiles { cert, key }
    }

    /// A client certificate for `cn` that expired in 2001.
    pub fn expired_client(&self, cn: &str) -> ClientFiles {
        let (cert, key) = self.issue(
            &format!("expired-{cn}"),
            cn,
            &[],
            ExtendedKeyUsagePurpose::ClientAuth,
            Some((2000, 2001)),
        );
        ClientFiles { cert, key }
    }

    fn issue(
        &self,
        file: &str,
        cn: &str,
        names: &[&str],
        usage: ExtendedKeyUsagePurpose,
        years: Option<(i32, i32)>,
    ) -> (PathBuf, PathBuf) {
        let key = KeyPair::generate().expect("leaf key");
        let names: Vec<String> = names.iter().map(|s| (*s).to_owned()).collect();
        let mut p = CertificateParams::new(names).expect("leaf params");
        p.distinguished_name.push(DnType::CommonName, cn);
        p.distinguished_name
            .push(DnType::OrganizationName, self.name.as_str());
        p.extended_key_usages = vec![usage];
        p.key_usages = vec![
            KeyUsagePurpose::DigitalSignature,
            KeyUsagePurpose::KeyEncipherment,
        ];
        if let Some((from, to)) = years {
            p.not_before = date_time_ymd(from, 1, 1);
            p.not_after = date_time_ymd(to, 1, 1);
        }
        let cert = p
            .signed_by(&key, &self.ca, &self.ca_key)
            .expect("sign the leaf");
        let (c, k) = (
            self.dir.path().join(format!("{file}.pem")),
            self.dir.path().join(format!("{file}-key.pem")),
        );
        std::fs::write(&c, cert.pem()).expect("write certificate");
        std::fs::write(&k, key.serialize_pem()).expect("write key");
        (c, k)
    }
}
