//! Test certificates, made by `openssl` (Debian's, installed by `scripts/setup.sh --test`):
//! a CA, a certificate it signed for `127.0.0.1` and `localhost` (a Redis server's, and a
//! client's), and another CA that signed nothing here (the one a replica must not trust).

use std::path::{Path, PathBuf};
use std::process::Command;

/// The files, in a directory of their own that is removed when dropped.
pub struct TestCertificates {
    dir: PathBuf,
}

impl TestCertificates {
    /// Makes a CA, a server certificate it signed, and an unrelated CA.
    pub fn generate() -> Self {
        static NEXT: std::sync::atomic::AtomicUsize = std::sync::atomic::AtomicUsize::new(0);
        let dir = std::env::temp_dir().join(format!(
            "toolrelay-certs-{}-{}",
            std::process::id(),
            NEXT.fetch_add(1, std::sync::atomic::Ordering::Relaxed)
        ));
        std::fs::create_dir_all(&dir).unwrap();
        let certificates = Self { dir };
        certificates.authority("ca", "toolrelay test CA");
        certificates.authority("other-ca", "a CA nobody trusts");
        std::fs::write(
            certificates.path("server.ext"),
            "subjectAltName=IP:127.0.0.1,DNS:localhost\nbasicConstraints=critical,CA:FALSE\nkeyUsage=critical,digitalSignature\nextendedKeyUsage=serverAuth,clientAuth\n",
        )
        .unwrap();
        certificates.openssl(&[
            "req",
            "-new",
            "-newkey",
            "ec",
            "-pkeyopt",
            "ec_paramgen_curve:prime256v1",
            "-nodes",
            "-keyout",
            "server.key",
            "-out",
            "server.csr",
            "-subj",
            "/CN=127.0.0.1",
        ]);
        certificates.openssl(&[
            "x509",
            "-req",
            "-in",
            "server.csr",
            "-CA",
            "ca.pem",
            "-CAkey",
            "ca.key",
            "-CAcreateserial",
            "-out",
            "server.pem",
            "-days",
            "2",
            "-extfile",
            "server.ext",
        ]);
        certificates
    }

    fn authority(&self, name: &str, subject: &str) {
        let key = format!("{name}.key");
        let pem = format!("{name}.pem");
        let subject = format!("/CN={subject}");
        self.openssl(&[
            "req",
            "-x509",
            "-newkey",
            "ec",
            "-pkeyopt",
            "ec_paramgen_curve:prime256v1",
            "-nodes",
            "-keyout",
            &key,
            "-out",
            &pem,
            "-days",
            "2",
            "-subj",
            &subject,
            "-addext",
            "basicConstraints=critical,CA:TRUE",
            "-addext",
            "keyUsage=critical,keyCertSign,cRLSign",
        ]);
    }

    fn openssl(&self, args: &[&str]) {
        let output = Command::new("openssl")
            .args(args)
            .current_dir(&self.dir)
            .output()
            .unwrap_or_else(|error| {
                panic!(
                    "openssl cannot run ({error}): run scripts/setup.sh --test, which installs it"
                )
            });
        assert!(
            output.status.success(),
            "openssl {args:?} failed: {}",
            String::from_utf8_lossy(&output.stderr)
        );
    }

    /// A file of the set: `ca.pem`, `server.pem`, `server.key`, `other-ca.pem`.
    pub fn path(&self, name: &str) -> PathBuf {
        self.dir.join(name)
    }

    /// The directory holding them.
    pub fn dir(&self) -> &Path {
        &self.dir
    }
}

impl Drop for TestCertificates {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}
