//! `edgeform certs import|list`: operator-provided certificates in the
//! control host's state directory ([`control::certs`]), never in git.
//! Nothing prints key material: certificates are shown by name, names,
//! not-after and SHA-256 fingerprint.

use std::io::Write as _;
use std::path::{Path, PathBuf};

use anyhow::Result;

/// What to do.
#[derive(Debug, clap::Subcommand)]
pub enum Action {
    /// Check a certificate chain and its key and keep them as NAME (sites
    /// say `tls: {certificate: NAME}`). Refused: not PEM, a key that is
    /// not the leaf's or is encrypted, a chain out of order (leaf first,
    /// then each issuer), a certificate expired or not yet valid.
    /// Replaces an earlier NAME; the next apply pushes it.
    Import {
        /// The certificate's name (`[a-z0-9][a-z0-9._-]*`).
        #[arg(value_name = "NAME")]
        name: String,
        /// The chain, PEM: the leaf first, then each issuer.
        #[arg(long = "cert", value_name = "CHAIN.pem")]
        cert: PathBuf,
        /// The leaf's private key, PEM, unencrypted.
        #[arg(long = "key", value_name = "KEY.pem")]
        key: PathBuf,
    },
    /// Order the certificate of every `tls: {acme: true}` site (or the
    /// one whose host is --site) from cluster.yaml's `acme` CA over
    /// HTTP-01: the challenges go to every edge node's Redis
    /// (`acme:<token>`, removed when the order ends). Kept as
    /// `acme.<host>`; the next apply pushes it. Exit 1 naming each failed
    /// host with the CA's problem document (its old certificate kept).
    Issue {
        /// Only the site whose host is HOST.
        #[arg(long, value_name = "HOST")]
        site: Option<String>,
    },
    /// Every certificate kept, a header line then one per line
    /// (tab-separated): name, DNS names, the leaf's issuer, not-before,
    /// not-after, the next renewal of an ACME certificate (`acme.<host>`;
    /// `due` when past), SHA-256 fingerprint (never the key), and what
    /// keeps it from being served (`expired`, …; `-` none).
    List {
        /// Output: human (a table) or json.
        #[arg(long, value_enum, default_value = "human")]
        format: super::Format,
    },
}

/// Run `action` on the state directory `dir` (`config`: the repository's,
/// read only by `issue`).
///
/// # Errors
/// The state directory is unsafe or unusable; the repository is invalid.
pub fn run(
    dir: &Path,
    action: &Action,
    config: impl FnOnce() -> Result<compiler::Config>,
) -> Result<u8> {
    let now = i64::try_from(compiler::clock::now()?).unwrap_or(i64::MAX);
    match action {
        Action::Issue { site } => issue(dir, &config()?, site.as_deref(), now),
        Action::Import { name, cert, key } => {
            let store = control::store::open(dir)?;
            match control::certs::import(&*store, name, cert, key, now) {
                Ok(c) => {
                    eprintln!(
                        "imported certificate `{name}` into {}: {} (not after {}, sha256:{}); \
                         the next apply pushes it to every edge carrying a site that uses it",
                        control::store::describe(dir),
                        c.names.join(", "),
                        compiler::clock::rfc3339_signed(c.not_after),
                        c.fingerprint
                    );
                    Ok(0)
                }
                Err(e) => {
                    eprintln!("error: {e}; nothing was imported");
                    Ok(1)
                }
            }
        }
        Action::List { format } => {
            let Some(store) = control::store::open_existing(dir)? else {
                if *format == super::Format::Json {
                    println!("[]");
                }
                return Ok(0);
            };
            let listed = control::certs::list(&*store)?;
            let mut out = std::io::stdout().lock();
            let mut bad = false;
            match format {
                super::Format::Human => {
                    writeln!(out, "{}", HEADER.join("\t"))?;
                    for (name, c) in &listed {
                        match c {
                            Ok(c) => {
                                let row = Row::of(name, c, now);
                                writeln!(
                                    out,
                                    "{name}\t{}\t{}\t{}\t{}\t{}\tsha256:{}\t{}",
                                    c.names.join(","),
                                    row.issuer.as_deref().unwrap_or("-"),
                                    compiler::clock::rfc3339_signed(c.not_before),
                                    compiler::clock::rfc3339_signed(c.not_after),
                                    row.renewal_shown(),
                                    c.fingerprint,
                                    row.problem.unwrap_or("-"),
                                )?;
                            }
                            Err(e) => {
                                bad = true;
                                writeln!(out, "{name}\t-\t-\t-\t-\t-\t-\t{}", e.kind.as_str())?;
                                eprintln!("error: {e}");
                            }
                        }
                    }
                }
                super::Format::Json => {
                    let items: Vec<serde_json::Value> = listed
                        .iter()
                        .map(|(name, c)| match c {
                            Ok(c) => {
                                let row = Row::of(name, c, now);
                                serde_json::json!({
                                    "name": name,
                                    "hosts": c.names,
                                    "issuer": row.issuer,
                                    "not_before": c.not_before,
                                    "not_before_rfc3339": compiler::clock::rfc3339_signed(c.not_before),
                                    "not_after": c.not_after,
                                    "not_after_rfc3339": compiler::clock::rfc3339_signed(c.not_after),
                                    "next_renewal": row.renew_at,
                                    "next_renewal_rfc3339": row.renew_at.map(compiler::clock::rfc3339_signed),
                                    "renewal_due": row.renew_at.map(|at| at <= now),
                                    "fingerprint": c.fingerprint,
                                    "problem": row.problem,
                                })
                            }
                            Err(e) => {
                                bad = true;
                                serde_json::json!({
                                    "name": name,
                                    "problem": e.kind.as_str(),
                                    "error": e.to_string(),
                                })
                            }
                        })
                        .collect();
                    writeln!(out, "{}", serde_json::Value::Array(items))?;
                }
            }
            Ok(u8::from(bad))
        }
    }
}

/// `certs issue`: one line per site, the failures on stderr.
fn issue(dir: &Path, config: &compiler::Config, site: Option<&str>, now: i64) -> Result<u8> {
    let store = control::store::open(dir)?;
    let outcomes =
        super::runtime()?.block_on(control::acme::issue_sites(config, &*store, site, now));
    let outcomes = match outcomes {
        Ok(o) => o,
        Err(e) => {
            eprintln!("error: {e}; nothing was issued");
            return Ok(1);
        }
    };
    let mut failed = false;
    for (site, outcome) in &outcomes {
        match outcome {
            Ok(c) => eprintln!(
                "issued certificate `{}` for site {site}: {} (not after {}, sha256:{})",
                c.name,
                c.names.join(", "),
                compiler::clock::rfc3339_signed(c.not_after),
                c.fingerprint
            ),
            Err(failures) => {
                failed = true;
                for f in failures {
                    // `host H got no certificate: {problem}[; retry after N s]`
                    eprintln!("error: site {site}: {f}");
                }
            }
        }
    }
    if outcomes.iter().any(|(_, o)| o.is_ok()) {
        eprintln!("the next apply (or reconcile) pushes the new certificates to the edges");
    }
    if failed {
        eprintln!("the sites that failed keep their old certificate");
    }
    Ok(u8::from(failed))
}

/// `certs list`'s columns (tab-separated, like its rows).
const HEADER: [&str; 8] = [
    "NAME",
    "HOSTS",
    "ISSUER",
    "NOT BEFORE",
    "NOT AFTER",
    "NEXT RENEWAL",
    "FINGERPRINT",
    "PROBLEM",
];

/// What `certs list` derives from a certificate beyond its fields.
struct Row {
    /// The leaf's issuer, one line.
    issuer: Option<String>,
    /// When the reconciler renews it: ACME certificates (`acme.<host>`) only.
    renew_at: Option<i64>,
    /// Why it cannot be served now (expired, key mismatch, …).
    problem: Option<&'static str>,
    now: i64,
}

impl Row {
    fn of(name: &str, c: &compiler::tls::Certificate, now: i64) -> Row {
        Row {
            issuer: control::certs::issuer(c),
            renew_at: name
                .starts_with("acme.")
                .then(|| control::renew::renew_at(c.not_before, c.not_after)),
            problem: control::certs::check_now(c, now)
                .err()
                .map(|e| e.kind.as_str()),
            now,
        }
    }

    /// `-` (not renewed here), `due` (past its renewal time) or the time.
    fn renewal_shown(&self) -> String {
        match self.renew_at {
            None => "-".to_owned(),
            Some(at) if at <= self.now => "due".to_owned(),
            Some(at) => compiler::clock::rfc3339_signed(at),
        }
    }
}
