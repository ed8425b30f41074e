//! `edgeform serve`'s flags; the API itself is [`ops::serve`].

use std::net::SocketAddr;
use std::path::PathBuf;

/// Arguments of `serve`.
#[derive(Debug, Clone, clap::Args)]
pub struct ServeArgs {
    /// Where to listen, e.g. 127.0.0.1:8440.
    #[arg(long, value_name = "ADDR")]
    pub listen: SocketAddr,
    /// Serve HTTPS with this certificate chain (PEM).
    #[arg(long, value_name = "FILE", requires = "tls_key")]
    pub tls_cert: Option<PathBuf>,
    /// The certificate's private key (PEM, PKCS8).
    #[arg(long, value_name = "FILE", requires = "tls_cert")]
    pub tls_key: Option<PathBuf>,
}

impl ServeArgs {
    /// The library's options.
    pub fn options(&self) -> ::ops::serve::ServeOptions {
        ::ops::serve::ServeOptions {
            listen: self.listen,
            tls_cert: self.tls_cert.clone(),
            tls_key: self.tls_key.clone(),
        }
    }
}
