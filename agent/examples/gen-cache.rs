//! Fill a folder with nginx-format cache files, for the demo and for
//! trying purges by hand:
//!
//! ```sh
//! cargo run -p agent --example gen-cache -- DIR LEVELS KEY...
//! cargo run -p agent --example gen-cache -- /tmp/cache/static 1:2 httpexample.com/a.mp4
//! ```
//!
//! Each key gets a file at the path nginx would use (md5, levels) with the
//! real header layout and a small body.

use std::path::PathBuf;
use std::process::ExitCode;

fn main() -> ExitCode {
    let mut args = std::env::args().skip(1);
    let (Some(dir), Some(levels)) = (args.next(), args.next()) else {
        eprintln!("usage: gen-cache DIR LEVELS KEY...");
        return ExitCode::from(2);
    };
    let levels = match agent::cache::Levels::parse(&levels) {
        Ok(l) => l,
        Err(e) => {
            eprintln!("levels: {e}");
            return ExitCode::from(2);
        }
    };
    let dir = PathBuf::from(dir);
    let mut n = 0;
    for key in args {
        let body = format!("cached body of {key}\n").repeat(64);
        if let Err(e) = agent::cache::write_cache_file(&dir, &levels, &key, body.as_bytes()) {
            eprintln!("{key}: {e}");
            return ExitCode::from(1);
        }
        n += 1;
    }
    eprintln!("wrote {n} cache files under {}", dir.display());
    ExitCode::SUCCESS
}
