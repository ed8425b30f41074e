//! Reaching a private config repository for `reconcile --pull`: git2's
//! credentials callback (SSH key file, ssh-agent, HTTPS token) and its
//! certificate check (SSH host keys against a `known_hosts` file; never
//! accepted blindly).
//!
//! The decisions are pure and tested without a network: [`KnownHosts`]
//! (parse, hashed `|1|salt|hash` names, `[host]:port`, wildcards,
//! `@revoked`), [`lookup_name`], [`choose_credential`]. [`fetch`] is the
//! I/O edge that wires them into git2.
//!
//! libgit2 also reads `~/.ssh/known_hosts` on its own (it uses it to pick
//! the host key algorithm and passes its verdict to the callback); the
//! callback here always answers itself, so only the file named by
//! `--known-hosts` decides.

use std::cell::RefCell;
use std::fmt;
use std::path::{Path, PathBuf};

/// The environment variable holding the HTTPS token.
pub const TOKEN_ENV: &str = "EDGEFORM_GIT_TOKEN";
/// The environment variable naming the SSH private key (same as `--ssh-key`).
pub const SSH_KEY_ENV: &str = "EDGEFORM_SSH_KEY";
/// The environment variable holding the SSH key's passphrase, if it has one.
pub const PASSPHRASE_ENV: &str = "EDGEFORM_SSH_KEY_PASSPHRASE";
/// The HTTPS user name sent with the token when the URL names none.
pub const TOKEN_USER: &str = "x-access-token";

/// `reconcile`'s settings for a private remote and for signed commits.
#[derive(Debug, Clone, Default)]
pub struct GitOptions {
    /// SSH private key for `--pull` over SSH (default: the keys in
    /// ssh-agent, through SSH_AUTH_SOCK; the key file may also come from
    /// [`SSH_KEY_ENV`]).
    pub ssh_key: Option<PathBuf>,
    /// known_hosts file the SSH server's host key must be in (default:
    /// ~/.ssh/known_hosts). An unknown or different host key is refused.
    pub known_hosts: Option<PathBuf>,
    /// Apply a commit only when it carries an SSH signature by a key in
    /// this allowed-signers file; otherwise refuse and keep the last good
    /// commit.
    pub require_signed_by: Option<PathBuf>,
}

impl GitOptions {
    /// The credentials to fetch with: the key file (as given), the
    /// known_hosts file (default `~/.ssh/known_hosts`), the token from
    /// [`TOKEN_ENV`].
    #[must_use]
    pub fn auth(&self) -> Auth {
        let known_hosts = self.known_hosts.clone().unwrap_or_else(|| {
            std::env::var_os("HOME")
                .map_or_else(|| PathBuf::from("/"), PathBuf::from)
                .join(".ssh/known_hosts")
        });
        Auth {
            ssh_key: self.ssh_key.clone(),
            passphrase: std::env::var(PASSPHRASE_ENV).ok().filter(|p| !p.is_empty()),
            known_hosts,
            token: std::env::var(TOKEN_ENV).ok().filter(|t| !t.is_empty()),
        }
    }
}

/// What a fetch may authenticate with.
#[derive(Clone, Default)]
pub struct Auth {
    pub ssh_key: Option<PathBuf>,
    pub passphrase: Option<String>,
    pub known_hosts: PathBuf,
    pub token: Option<String>,
}

impl fmt::Debug for Auth {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Auth")
            .field("ssh_key", &self.ssh_key)
            .field("passphrase", &self.passphrase.as_ref().map(|_| "…"))
            .field("known_hosts", &self.known_hosts)
            .field("token", &self.token.as_ref().map(|_| "…"))
            .finish()
    }
}

// ---------------------------------------------------------------- errors

/// Why a pull failed. Each is one line naming what to look at.
#[derive(Debug)]
pub enum PullError {
    /// `--pull` is not REMOTE/BRANCH.
    Spec(String),
    /// Not in a git repository.
    NoRepository(PathBuf),
    /// No such remote.
    NoRemote(String),
    /// The spec splits into two existing remotes and their branches
    /// (`corp/origin/main`: remote `corp` or `corp/origin`).
    Ambiguous { spec: String, remotes: Vec<String> },
    /// The SSH key file cannot be read.
    KeyFile { path: PathBuf, cause: String },
    /// The known_hosts file cannot be read.
    KnownHostsFile { path: PathBuf, cause: String },
    /// The server's host key is not the one the known_hosts file names.
    HostKey {
        host: String,
        known_hosts: PathBuf,
        verdict: HostKeyVerdict,
    },
    /// The server asked for credentials this reconciler has none of.
    NoCredentials { url: String, why: NoCredential },
    /// The server refused the credentials offered.
    AuthFailed { url: String, cause: String },
    /// Anything else git2 reports (network, missing branch, …).
    Fetch { spec: String, cause: String },
}

impl PullError {
    /// A short, stable name for the kind (for logs and metrics).
    #[must_use]
    pub fn kind(&self) -> &'static str {
        match self {
            Self::Spec(_) => "usage",
            Self::NoRepository(_) => "no_repository",
            Self::NoRemote(_) => "no_remote",
            Self::Ambiguous { .. } => "usage",
            Self::KeyFile { .. } => "key_file",
            Self::KnownHostsFile { .. } => "known_hosts_file",
            Self::HostKey { .. } => "host_key",
            Self::NoCredentials { .. } => "no_credentials",
            Self::AuthFailed { .. } => "auth_failed",
            Self::Fetch { .. } => "fetch",
        }
    }
}

impl fmt::Display for PullError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Self::Spec(s) => write!(
                f,
                "--pull takes REMOTE/BRANCH, e.g. origin/main (not `{s}`)"
            ),
            Self::NoRepository(p) => write!(f, "--pull needs a git repository ({})", p.display()),
            Self::NoRemote(r) => write!(f, "no remote `{r}`"),
            Self::Ambiguous { spec, remotes } => write!(
                f,
                "--pull {spec}: the remotes {} each make it a branch; rename one",
                remotes
                    .iter()
                    .map(|r| format!("`{r}`"))
                    .collect::<Vec<_>>()
                    .join(" and ")
            ),
            Self::KeyFile { path, cause } => {
                write!(f, "ssh key {}: cannot read it: {cause}", path.display())
            }
            Self::KnownHostsFile { path, cause } => {
                write!(f, "known_hosts {}: cannot read it: {cause}", path.display())
            }
            Self::HostKey {
                host,
                known_hosts,
                verdict,
            } => match verdict {
                HostKeyVerdict::Unknown => write!(
                    f,
                    "host key of {host} is unknown: not in {} (add it after checking its \
                     fingerprint, e.g. ssh-keyscan); refused",
                    known_hosts.display()
                ),
                HostKeyVerdict::Mismatch { key_type } => write!(
                    f,
                    "host key of {host} ({key_type}) does not match {}: a different server, \
                     or the key changed; refused",
                    known_hosts.display()
                ),
                HostKeyVerdict::Revoked => write!(
                    f,
                    "host key of {host} is marked @revoked in {}; refused",
                    known_hosts.display()
                ),
                HostKeyVerdict::Match => write!(f, "host key of {host} matches"),
            },
            Self::NoCredentials { url, why } => write!(f, "{url}: {why}"),
            Self::AuthFailed { url, cause } => {
                write!(f, "{url}: authentication failed: {cause}")
            }
            Self::Fetch { spec, cause } => write!(f, "fetching {spec}: {cause}"),
        }
    }
}

impl std::error::Error for PullError {}

// ------------------------------------------------------------- remote URL

/// Where a remote is, as far as credentials and host keys go.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Endpoint {
    /// `ssh://[user@]host[:port]/path` or scp-like `[user@]host:path`.
    Ssh {
        user: Option<String>,
        host: String,
        port: u16,
    },
    /// `https://` or `http://`.
    Http { user: Option<String> },
    /// A path or `file://` (no credentials).
    Local,
}

/// Classify a remote URL.
#[must_use]
pub fn endpoint(url: &str) -> Endpoint {
    if let Some((scheme, _)) = url.split_once("://") {
        let scheme = scheme.to_ascii_lowercase();
        let Ok(u) = url::Url::parse(url) else {
            return Endpoint::Local;
        };
        let user = Some(u.username().to_owned()).filter(|s| !s.is_empty());
        return match scheme.as_str() {
            "ssh" | "git+ssh" | "ssh+git" => Endpoint::Ssh {
                user,
                host: u
                    .host_str()
                    .unwrap_or_default()
                    .trim_start_matches('[')
                    .trim_end_matches(']')
                    .to_owned(),
                port: u.port().unwrap_or(22),
            },
            "http" | "https" => Endpoint::Http { user },
            _ => Endpoint::Local,
        };
    }
    // scp-like: `[user@]host:path`, where the part before the first `:`
    // has no `/` (otherwise it is a local path).
    match url.split_once(':') {
        Some((before, _)) if !before.contains('/') && !before.is_empty() => {
            let (user, host) = match before.rsplit_once('@') {
                Some((u, h)) => (Some(u.to_owned()), h),
                None => (None, before),
            };
            Endpoint::Ssh {
                user,
                host: host
                    .trim_start_matches('[')
                    .trim_end_matches(']')
                    .to_owned(),
                port: 22,
            }
        }
        _ => Endpoint::Local,
    }
}

/// The name a host is listed under in known_hosts: `host` on port 22,
/// `[host]:port` otherwise (as OpenSSH writes and looks it up).
#[must_use]
pub fn lookup_name(host: &str, port: u16) -> String {
    if port == 22 {
        host.to_owned()
    } else {
        format!("[{host}]:{port}")
    }
}

// ------------------------------------------------------------ known_hosts

/// What the known_hosts file says of a host's key.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum HostKeyVerdict {
    /// Listed with this very key.
    Match,
    /// Listed, but with other keys only.
    Mismatch { key_type: String },
    /// Not listed at all.
    Unknown,
    /// This key is marked `@revoked`.
    Revoked,
}

#[derive(Debug, Clone)]
enum HostPattern {
    /// Comma-separated patterns (`*`, `?`, `!negated`), lowercased.
    Plain(Vec<String>),
    /// `|1|base64(salt)|base64(HMAC-SHA1(salt, name))`.
    Hashed { salt: Vec<u8>, hash: Vec<u8> },
}

#[derive(Debug, Clone)]
struct KnownHost {
    revoked: bool,
    hosts: HostPattern,
    key: Vec<u8>,
}

/// A parsed known_hosts file. Lines OpenSSH would skip (comments, blank,
/// unparsable, `@cert-authority`) are skipped here too.
#[derive(Debug, Clone, Default)]
pub struct KnownHosts {
    entries: Vec<KnownHost>,
}

impl KnownHosts {
    /// Parse known_hosts text.
    #[must_use]
    pub fn parse(text: &str) -> Self {
        let entries = text.lines().filter_map(parse_known_host).collect();
        Self { entries }
    }

    /// How many usable entries the file has.
    #[must_use]
    pub fn len(&self) -> usize {
        self.entries.len()
    }

    /// Whether the file has no usable entry.
    #[must_use]
    pub fn is_empty(&self) -> bool {
        self.entries.is_empty()
    }

    /// Check `key` (the raw public key blob the server sent) for `name`
    /// (see [`lookup_name`]).
    #[must_use]
    pub fn check(&self, name: &str, key: &[u8]) -> HostKeyVerdict {
        let name = name.to_ascii_lowercase();
        let mut listed = false;
        let mut matched = false;
        for e in self
            .entries
            .iter()
            .filter(|e| host_matches(&e.hosts, &name))
        {
            if e.revoked {
                if e.key == key {
                    return HostKeyVerdict::Revoked;
                }
                continue;
            }
            listed = true;
            matched |= e.key == key;
        }
        if matched {
            HostKeyVerdict::Match
        } else if listed {
            HostKeyVerdict::Mismatch {
                key_type: key_type(key).unwrap_or("unknown type").to_owned(),
            }
        } else {
            HostKeyVerdict::Unknown
        }
    }
}

/// The key type a public key blob names (its first SSH string).
#[must_use]
pub fn key_type(blob: &[u8]) -> Option<&str> {
    let len = u32::from_be_bytes(blob.get(..4)?.try_into().ok()?) as usize;
    std::str::from_utf8(blob.get(4..4 + len)?).ok()
}

fn parse_known_host(line: &str) -> Option<KnownHost> {
    let line = line.trim();
    if line.is_empty() || line.starts_with('#') {
        return None;
    }
    let mut fields = line.split_whitespace();
    let mut first = fields.next()?;
    let mut revoked = false;
    if let Some(marker) = first.strip_prefix('@') {
        match marker {
            "revoked" => revoked = true,
            // Host certificates are not supported: such a line vouches for
            // nothing here.
            _ => return None,
        }
        first = fields.next()?;
    }
    let key_type_field = fields.next()?;
    let key = decode_base64(fields.next()?)?;
    if key_type(&key) != Some(key_type_field) {
        return None;
    }
    let hosts = if let Some(rest) = first.strip_prefix("|1|") {
        let (salt, hash) = rest.split_once('|')?;
        HostPattern::Hashed {
            salt: decode_base64(salt)?,
            hash: decode_base64(hash)?,
        }
    } else {
        HostPattern::Plain(
            first
                .split(',')
                .filter(|p| !p.is_empty())
                .map(str::to_ascii_lowercase)
                .collect(),
        )
    };
    Some(KnownHost {
        revoked,
        hosts,
        key,
    })
}

fn host_matches(hosts: &HostPattern, name: &str) -> bool {
    match hosts {
        HostPattern::Hashed { salt, hash } => {
            edgestate::edge::hmac_sha1(salt, name.as_bytes()).as_slice() == hash.as_slice()
        }
        HostPattern::Plain(patterns) => {
            let mut hit = false;
            for p in patterns {
                if let Some(neg) = p.strip_prefix('!') {
                    if glob(neg.as_bytes(), name.as_bytes()) {
                        return false;
                    }
                } else if glob(p.as_bytes(), name.as_bytes()) {
                    hit = true;
                }
            }
            hit
        }
    }
}

/// OpenSSH's host patterns: `*` any run, `?` any one character.
fn glob(p: &[u8], s: &[u8]) -> bool {
    match p.split_first() {
        None => s.is_empty(),
        Some((b'*', rest)) => (0..=s.len()).any(|i| glob(rest, &s[i..])),
        Some((b'?', rest)) => !s.is_empty() && glob(rest, &s[1..]),
        Some((c, rest)) => s.first() == Some(c) && glob(rest, &s[1..]),
    }
}

/// Standard base64 (padding optional); `None` on anything else.
#[must_use]
pub fn decode_base64(text: &str) -> Option<Vec<u8>> {
    let text = text.trim_end_matches('=');
    let mut out = Vec::with_capacity(text.len() * 3 / 4);
    let mut acc = 0u32;
    let mut bits = 0;
    for c in text.bytes() {
        let v = match c {
            b'A'..=b'Z' => c - b'A',
            b'a'..=b'z' => c - b'a' + 26,
            b'0'..=b'9' => c - b'0' + 52,
            b'+' => 62,
            b'/' => 63,
            _ => return None,
        };
        acc = (acc << 6) | u32::from(v);
        bits += 6;
        if bits >= 8 {
            bits -= 8;
            out.push((acc >> bits) as u8);
            acc &= (1 << bits) - 1;
        }
    }
    // A lone sixth of a byte cannot come from an encoder.
    if bits >= 6 {
        return None;
    }
    Some(out)
}

// ------------------------------------------------------------ credentials

/// What the server asked for that cannot be given.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum NoCredential {
    /// HTTPS needs a token and the environment variable is empty.
    NoToken,
    /// The only methods offered are ones this reconciler does not use.
    Unsupported,
    /// Every credential was offered once and refused.
    Exhausted,
}

impl fmt::Display for NoCredential {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Self::NoToken => write!(f, "the server asks for a token; set {TOKEN_ENV}"),
            Self::Unsupported => write!(
                f,
                "the server asks for a kind of credential edgeform does not offer \
                 (SSH key or HTTPS token)"
            ),
            Self::Exhausted => write!(f, "the credentials offered were refused"),
        }
    }
}

/// The credential to offer on one callback.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Credential {
    /// Only the SSH user name (libgit2 asks first when the URL has none).
    Username(String),
    /// This key file.
    SshKey { user: String, key: PathBuf },
    /// The keys in ssh-agent.
    SshAgent { user: String },
    /// HTTPS user name and token.
    Token { user: String },
}

/// What the callback has offered so far on this fetch.
#[derive(Debug, Clone, Copy, Default)]
pub struct Offered {
    pub username: bool,
    pub ssh: bool,
    pub token: bool,
}

/// The methods the server allows, from git2's bits.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Allowed {
    pub username: bool,
    pub ssh_key: bool,
    pub user_pass: bool,
}

impl From<git2::CredentialType> for Allowed {
    fn from(t: git2::CredentialType) -> Self {
        Self {
            username: t.contains(git2::CredentialType::USERNAME),
            ssh_key: t.contains(git2::CredentialType::SSH_KEY),
            user_pass: t.contains(git2::CredentialType::USER_PASS_PLAINTEXT),
        }
    }
}

/// The local user name, as OpenSSH uses when the URL has none.
#[must_use]
pub fn local_user() -> String {
    std::env::var("USER")
        .ok()
        .filter(|u| !u.is_empty())
        .unwrap_or_else(|| "git".to_owned())
}

/// Pure: which credential to offer, given what the server allows, the user
/// name from the URL, what this reconciler has, and what was offered
/// already (each at most once, so a refused credential ends the fetch
/// instead of looping).
///
/// # Errors
/// Nothing (more) to offer.
pub fn choose_credential(
    allowed: Allowed,
    url_user: Option<&str>,
    auth: &Auth,
    offered: Offered,
) -> Result<Credential, NoCredential> {
    let ssh_user = || url_user.map_or_else(local_user, str::to_owned);
    if allowed.ssh_key {
        if offered.ssh {
            return Err(NoCredential::Exhausted);
        }
        return Ok(match &auth.ssh_key {
            Some(key) => Credential::SshKey {
                user: ssh_user(),
                key: key.clone(),
            },
            None => Credential::SshAgent { user: ssh_user() },
        });
    }
    if allowed.username {
        if offered.username {
            return Err(NoCredential::Exhausted);
        }
        return Ok(Credential::Username(ssh_user()));
    }
    if allowed.user_pass {
        if offered.token {
            return Err(NoCredential::Exhausted);
        }
        if auth.token.is_none() {
            return Err(NoCredential::NoToken);
        }
        return Ok(Credential::Token {
            user: url_user.unwrap_or(TOKEN_USER).to_owned(),
        });
    }
    Err(NoCredential::Unsupported)
}

// ------------------------------------------------------------------ fetch

/// Check that a key file can be read, before any connection.
///
/// # Errors
/// [`PullError::KeyFile`] naming it.
pub fn check_key_file(path: &Path) -> Result<(), PullError> {
    let fail = |cause: String| PullError::KeyFile {
        path: path.to_owned(),
        cause,
    };
    let text = std::fs::read(path).map_err(|e| fail(io_cause(&e)))?;
    if text.is_empty() {
        return Err(fail("it is empty".to_owned()));
    }
    Ok(())
}

fn io_cause(e: &std::io::Error) -> String {
    let s = e.to_string();
    // "Permission denied (os error 13)" → "Permission denied".
    s.split(" (os error").next().unwrap_or(&s).to_owned()
}

/// Fetch `refspec` from `remote` with the credentials and host key checks
/// above. The `spec` is only for messages.
///
/// # Errors
/// Every [`PullError`].
pub fn fetch(
    remote: &mut git2::Remote<'_>,
    refspec: &str,
    spec: &str,
    auth: &Auth,
) -> Result<(), PullError> {
    let url = remote.url().unwrap_or_default().to_owned();
    let ep = endpoint(&url);
    let known = match &ep {
        Endpoint::Ssh { .. } => {
            if let Some(key) = &auth.ssh_key {
                check_key_file(key)?;
            }
            let text = std::fs::read_to_string(&auth.known_hosts).map_err(|e| {
                PullError::KnownHostsFile {
                    path: auth.known_hosts.clone(),
                    cause: io_cause(&e),
                }
            })?;
            Some(KnownHosts::parse(&text))
        }
        _ => None,
    };
    let failure: RefCell<Option<PullError>> = RefCell::new(None);
    let offered = RefCell::new(Offered::default());
    let mut cb = git2::RemoteCallbacks::new();
    cb.credentials(|cb_url, username, types| {
        let mut o = offered.borrow_mut();
        let url_user = username.or(match &ep {
            Endpoint::Ssh { user, .. } | Endpoint::Http { user } => user.as_deref(),
            Endpoint::Local => None,
        });
        match choose_credential(types.into(), url_user, auth, *o) {
            Ok(Credential::Username(user)) => {
                o.username = true;
                git2::Cred::username(&user)
            }
            Ok(Credential::SshKey { user, key }) => {
                o.ssh = true;
                git2::Cred::ssh_key(&user, None, &key, auth.passphrase.as_deref())
            }
            Ok(Credential::SshAgent { user }) => {
                o.ssh = true;
                git2::Cred::ssh_key_from_agent(&user)
            }
            Ok(Credential::Token { user }) => {
                o.token = true;
                git2::Cred::userpass_plaintext(&user, auth.token.as_deref().unwrap_or_default())
            }
            Err(why) => {
                let err = PullError::NoCredentials {
                    url: cb_url.to_owned(),
                    why,
                };
                let msg = err.to_string();
                *failure.borrow_mut() = Some(err);
                Err(git2::Error::from_str(&msg))
            }
        }
    });
    cb.certificate_check(|cert, host| {
        let Some(hostkey) = cert.as_hostkey() else {
            // TLS: libgit2's own verification against the system trust
            // store decides.
            return Ok(git2::CertificateCheckStatus::CertificatePassthrough);
        };
        let port = match &ep {
            Endpoint::Ssh { port, .. } => *port,
            _ => 22,
        };
        let name = lookup_name(host, port);
        let verdict = match (hostkey.hostkey(), &known) {
            (Some(key), Some(known)) => known.check(&name, key),
            _ => HostKeyVerdict::Unknown,
        };
        if verdict == HostKeyVerdict::Match {
            return Ok(git2::CertificateCheckStatus::CertificateOk);
        }
        let err = PullError::HostKey {
            host: name,
            known_hosts: auth.known_hosts.clone(),
            verdict,
        };
        let msg = err.to_string();
        *failure.borrow_mut() = Some(err);
        Err(git2::Error::new(
            git2::ErrorCode::Certificate,
            git2::ErrorClass::Ssh,
            msg,
        ))
    });
    let mut opts = git2::FetchOptions::new();
    opts.remote_callbacks(cb);
    // Only the branch asked for: no tag comes along (a pushed tag named
    // like the remote branch would otherwise be what a short name finds).
    opts.download_tags(git2::AutotagOption::None);
    let result = remote.fetch(&[refspec], Some(&mut opts), None);
    drop(opts);
    match result {
        Ok(()) => Ok(()),
        Err(e) => Err(failure.into_inner().unwrap_or_else(|| {
            if e.code() == git2::ErrorCode::Auth {
                PullError::AuthFailed {
                    url: url.clone(),
                    cause: e.message().to_owned(),
                }
            } else {
                PullError::Fetch {
                    spec: spec.to_owned(),
                    cause: e.message().to_owned(),
                }
            }
        })),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const ED: &str = "AAAAC3NzaC1lZDI1NTE5AAAAIBd3x1KHSv4bd2yJ5ZWJ2aEiS0uqGBv8FUFp4wGz2cGF";
    const OTHER: &str = "AAAAC3NzaC1lZDI1NTE5AAAAIE1yZCbl6y7bV1MeijKBX2gHnzn9ceNqtQ1oQ7cHtpTt";

    fn blob(b64: &str) -> Vec<u8> {
        decode_base64(b64).unwrap()
    }

    #[test]
    fn urls_are_classified() {
        assert_eq!(
            endpoint("ssh://git@example.net:2222/cdn/config.git"),
            Endpoint::Ssh {
                user: Some("git".into()),
                host: "example.net".into(),
                port: 2222
            }
        );
        assert_eq!(
            endpoint("git@example.net:cdn/config.git"),
            Endpoint::Ssh {
                user: Some("git".into()),
                host: "example.net".into(),
                port: 22
            }
        );
        assert_eq!(
            endpoint("ssh://[::1]/x"),
            Endpoint::Ssh {
                user: None,
                host: "::1".into(),
                port: 22
            }
        );
        assert_eq!(
            endpoint("https://example.net/cdn/config.git"),
            Endpoint::Http { user: None }
        );
        assert_eq!(endpoint("/srv/git/config.git"), Endpoint::Local);
        assert_eq!(endpoint("./a:b"), Endpoint::Local);
        assert_eq!(endpoint("file:///srv/x"), Endpoint::Local);
        assert_eq!(lookup_name("example.net", 22), "example.net");
        assert_eq!(lookup_name("127.0.0.1", 2222), "[127.0.0.1]:2222");
    }

    #[test]
    fn base64_round_trips_and_rejects_junk() {
        assert_eq!(decode_base64("aGVsbG8=").unwrap(), b"hello");
        assert_eq!(decode_base64("aGVsbG8").unwrap(), b"hello");
        assert_eq!(decode_base64("").unwrap(), b"");
        assert!(decode_base64("a$==").is_none());
        assert!(decode_base64("a").is_none());
        assert_eq!(key_type(&blob(ED)), Some("ssh-ed25519"));
    }

    #[test]
    fn plain_and_port_entries() {
        let k = KnownHosts::parse(&format!(
            "# comment\n\nexample.net,192.0.2.1 ssh-ed25519 {ED}\n\
             [127.0.0.1]:2222 ssh-ed25519 {ED} comment here\n\
             garbage line\n*.wild.example ssh-ed25519 {ED}\n"
        ));
        assert_eq!(k.len(), 3);
        assert_eq!(k.check("example.net", &blob(ED)), HostKeyVerdict::Match);
        assert_eq!(k.check("EXAMPLE.net", &blob(ED)), HostKeyVerdict::Match);
        assert_eq!(k.check("192.0.2.1", &blob(ED)), HostKeyVerdict::Match);
        assert_eq!(
            k.check("[127.0.0.1]:2222", &blob(ED)),
            HostKeyVerdict::Match
        );
        // The same host on another port is another entry.
        assert_eq!(k.check("127.0.0.1", &blob(ED)), HostKeyVerdict::Unknown);
        assert_eq!(
            k.check("[127.0.0.1]:2223", &blob(ED)),
            HostKeyVerdict::Unknown
        );
        assert_eq!(
            k.check("example.net", &blob(OTHER)),
            HostKeyVerdict::Mismatch {
                key_type: "ssh-ed25519".into()
            }
        );
        assert_eq!(k.check("a.wild.example", &blob(ED)), HostKeyVerdict::Match);
        assert_eq!(k.check("wild.example", &blob(ED)), HostKeyVerdict::Unknown);
    }

    #[test]
    fn hashed_negated_and_revoked_entries() {
        // `ssh-keygen -H` of "[127.0.0.1]:2222" with this salt.
        let salt = b"0123456789abcdefghij";
        let hash = edgestate::edge::hmac_sha1(salt, b"[127.0.0.1]:2222");
        let enc = |b: &[u8]| {
            // Encode by hand through the decoder's alphabet.
            const A: &[u8] = b"ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/";
            let mut s = String::new();
            for chunk in b.chunks(3) {
                let n = chunk
                    .iter()
                    .enumerate()
                    .fold(0u32, |acc, (i, &x)| acc | (u32::from(x) << (16 - 8 * i)));
                for i in 0..=chunk.len() {
                    s.push(A[((n >> (18 - 6 * i)) & 63) as usize] as char);
                }
            }
            s
        };
        assert_eq!(decode_base64(&enc(salt)).unwrap(), salt);
        let k = KnownHosts::parse(&format!(
            "|1|{}|{} ssh-ed25519 {ED}\n*.example,!bad.example ssh-ed25519 {ED}\n\
             @revoked * ssh-ed25519 {OTHER}\n@cert-authority * ssh-ed25519 {OTHER}\n",
            enc(salt),
            enc(&hash)
        ));
        assert_eq!(
            k.check("[127.0.0.1]:2222", &blob(ED)),
            HostKeyVerdict::Match
        );
        assert_eq!(k.check("127.0.0.1", &blob(ED)), HostKeyVerdict::Unknown);
        assert_eq!(k.check("good.example", &blob(ED)), HostKeyVerdict::Match);
        assert_eq!(k.check("bad.example", &blob(ED)), HostKeyVerdict::Unknown);
        assert_eq!(
            k.check("good.example", &blob(OTHER)),
            HostKeyVerdict::Revoked
        );
    }

    fn auth(key: Option<&str>, token: Option<&str>) -> Auth {
        Auth {
            ssh_key: key.map(PathBuf::from),
            passphrase: None,
            known_hosts: PathBuf::from("/k"),
            token: token.map(str::to_owned),
        }
    }

    #[test]
    fn credential_choice() {
        let ssh = Allowed {
            ssh_key: true,
            ..Allowed::default()
        };
        let user = Allowed {
            username: true,
            ..Allowed::default()
        };
        let https = Allowed {
            user_pass: true,
            ..Allowed::default()
        };
        let none = Offered::default();
        // SSH: the key file when given, else the agent; once each.
        assert_eq!(
            choose_credential(ssh, Some("git"), &auth(Some("/id"), None), none),
            Ok(Credential::SshKey {
                user: "git".into(),
                key: "/id".into()
            })
        );
        assert_eq!(
            choose_credential(ssh, Some("git"), &auth(None, Some("t")), none),
            Ok(Credential::SshAgent { user: "git".into() })
        );
        let after_ssh = Offered { ssh: true, ..none };
        assert_eq!(
            choose_credential(ssh, Some("git"), &auth(Some("/id"), None), after_ssh),
            Err(NoCredential::Exhausted)
        );
        assert_eq!(
            choose_credential(user, Some("git"), &auth(None, None), none),
            Ok(Credential::Username("git".into()))
        );
        // HTTPS: the token, with the URL's user or the default one.
        assert_eq!(
            choose_credential(https, None, &auth(Some("/id"), Some("t")), none),
            Ok(Credential::Token {
                user: TOKEN_USER.into()
            })
        );
        assert_eq!(
            choose_credential(https, Some("ci"), &auth(None, Some("t")), none),
            Ok(Credential::Token { user: "ci".into() })
        );
        assert_eq!(
            choose_credential(https, None, &auth(Some("/id"), None), none),
            Err(NoCredential::NoToken)
        );
        let after_token = Offered {
            token: true,
            ..none
        };
        assert_eq!(
            choose_credential(https, None, &auth(None, Some("t")), after_token),
            Err(NoCredential::Exhausted)
        );
        assert_eq!(
            choose_credential(Allowed::default(), None, &auth(None, Some("t")), none),
            Err(NoCredential::Unsupported)
        );
    }

    #[test]
    fn an_unreadable_key_file_is_named() {
        let e = check_key_file(Path::new("/nonexistent/id_ed25519")).unwrap_err();
        assert_eq!(e.kind(), "key_file");
        assert_eq!(
            e.to_string(),
            "ssh key /nonexistent/id_ed25519: cannot read it: No such file or directory"
        );
    }
}
