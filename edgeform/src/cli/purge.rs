//! `edgeform purge`'s flags; the jobs and the wait are [`ops::purge`].

/// What to purge.
#[derive(Debug, Clone, clap::Args)]
#[group(multiple = false)]
pub struct What {
    /// One URL (`https://host/path?query`) or path (`/path`, both schemes):
    /// an exact-key purge, no scan.
    #[arg(long, value_name = "URL|PATH")]
    pub url: Option<String>,
    /// Every URL whose path starts with PATH.
    #[arg(long, value_name = "PATH")]
    pub prefix: Option<String>,
    /// Every URL whose path (with query) matches RE (`^` anchors at the
    /// path's start).
    #[arg(long, value_name = "RE")]
    pub regex: Option<String>,
    /// Everything cached for the site.
    #[arg(long)]
    pub all: bool,
}

impl What {
    /// Whether one of the flags is given.
    pub fn given(&self) -> bool {
        self.url.is_some() || self.prefix.is_some() || self.regex.is_some() || self.all
    }

    /// The library's options.
    pub fn options(&self) -> ::ops::purge::What {
        ::ops::purge::What {
            url: self.url.clone(),
            prefix: self.prefix.clone(),
            regex: self.regex.clone(),
            all: self.all,
        }
    }
}
