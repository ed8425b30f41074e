//! Site certificates for HTTPS tests, made with `openssl` in a temporary
//! folder: a CA and, signed by it, certificates with chosen DNS names and
//! lifetimes (a leaf, a wildcard, an expired one, one for another name),
//! each with its key and a chain file (leaf first, then the CA).

use std::path::{Path, PathBuf};

/// A CA and the certificates made with [`SiteCerts::sign`].
pub struct SiteCerts {
    dir: tempfile::TempDir,
}

impl SiteCerts {
    /// A fresh CA (`ca.pem`, `ca.key`), valid ten years.
    ///
    /// # Panics
    /// When `openssl` fails.
    #[must_use]
    pub fn new() -> SiteCerts {
        let dir = tempfile::tempdir().expect("tempdir");
        super::run_in(
            dir.path(),
            "openssl",
            &[
                "req",
                "-x509",
                "-newkey",
                "ec",
                "-pkeyopt",
                "ec_paramgen_curve:P-256",
                "-nodes",
                "-days",
                "3650",
                "-subj",
                "/CN=edgeform test site CA",
                "-addext",
                "basicConstraints=critical,CA:TRUE",
                "-addext",
                "keyUsage=critical,keyCertSign,cRLSign",
                "-keyout",
                "ca.key",
                "-out",
                "ca.pem",
            ],
        );
        SiteCerts { dir }
    }

    /// Sign a leaf `name` with the CA: `<name>.pem`, `<name>.key`,
    /// `<name>.chain.pem` (leaf, then the CA), for the names `dns` (an IP
    /// address is an IP name), valid `days` days from now (`-1`: expired
    /// yesterday).
    ///
    /// # Panics
    /// When `openssl` fails.
    pub fn sign(&self, name: &str, dns: &[&str], days: i32) -> &SiteCerts {
        let d = self.dir.path();
        let san = dns
            .iter()
            .map(|n| {
                if n.parse::<std::net::IpAddr>().is_ok() {
                    format!("IP:{n}")
                } else {
                    format!("DNS:{n}")
                }
            })
            .collect::<Vec<_>>()
            .join(",");
        std::fs::write(
            d.join(format!("{name}.ext")),
            format!("subjectAltName={san}\nbasicConstraints=CA:FALSE\n"),
        )
        .expect("write ext");
        let key = format!("{name}.key");
        let csr = format!("{name}.csr");
        let pem = format!("{name}.pem");
        super::run_in(
            d,
            "openssl",
            &[
                "req",
                "-newkey",
                "ec",
                "-pkeyopt",
                "ec_paramgen_curve:P-256",
                "-nodes",
                "-subj",
                &format!("/CN={}", dns.first().copied().unwrap_or(name)),
                "-keyout",
                &key,
                "-out",
                &csr,
            ],
        );
        super::run_in(
            d,
            "openssl",
            &[
                "x509",
                "-req",
                "-in",
                &csr,
                "-CA",
                "ca.pem",
                "-CAkey",
                "ca.key",
                "-CAcreateserial",
                "-days",
                &days.to_string(),
                "-extfile",
                &format!("{name}.ext"),
                "-out",
                &pem,
            ],
        );
        let chain = [
            std::fs::read_to_string(d.join(&pem)).expect("leaf"),
            std::fs::read_to_string(d.join("ca.pem")).expect("ca"),
        ]
        .concat();
        std::fs::write(d.join(format!("{name}.chain.pem")), chain).expect("write chain");
        self
    }

    /// A file of the folder (`ca.pem`, `<name>.pem`, `<name>.key`,
    /// `<name>.chain.pem`).
    #[must_use]
    pub fn file(&self, name: &str) -> PathBuf {
        self.dir.path().join(name)
    }

    /// The folder.
    #[must_use]
    pub fn dir(&self) -> &Path {
        self.dir.path()
    }
}

impl Default for SiteCerts {
    fn default() -> Self {
        SiteCerts::new()
    }
}
