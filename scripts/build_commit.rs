// Included by agent/build.rs and compiler/build.rs: records the git commit
// a binary was built from, for `--version`.

fn main() {
    // A tarball without .git: the packager may pass the commit in
    // EDGEFORM_COMMIT; otherwise "unknown commit".
    println!("cargo:rerun-if-env-changed=EDGEFORM_COMMIT");
    if let Some(commit) = std::env::var("EDGEFORM_COMMIT")
        .ok()
        .filter(|c| !c.trim().is_empty())
    {
        println!("cargo:rustc-env=EDGEFORM_COMMIT={}", commit.trim());
        return;
    }
    let commit = std::process::Command::new("git")
        .args(["rev-parse", "--short=12", "HEAD"])
        .output()
        .ok()
        .filter(|o| o.status.success())
        .and_then(|o| String::from_utf8(o.stdout).ok())
        .map(|s| s.trim().to_owned())
        .filter(|s| !s.is_empty())
        .unwrap_or_else(|| "unknown commit".to_owned());
    println!("cargo:rustc-env=EDGEFORM_COMMIT={commit}");
    println!("cargo:rerun-if-changed=../.git/HEAD");
    println!("cargo:rerun-if-changed=../.git/refs/heads");
    println!("cargo:rerun-if-changed=../scripts/build_commit.rs");
}
