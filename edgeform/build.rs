//! Records the git commit the binary was built from, for `--version`.

include!("../scripts/build_commit.rs");
