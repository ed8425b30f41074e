//! `edgeform init [DIR]`: a new config repository that passes `check`
//! as it is — `cluster.yaml`, one site, one zone, one edge node, the
//! reference edge's role (`roles/edge/`, the files this binary was built
//! with, so the edge code matches what this `edgeform` compiles), the JSON
//! Schemas with a modeline in every file, committed as the first commit.

use std::path::Path;

use anyhow::{Context, Result, bail};

use compiler::load::Kind;

/// The edge role, as in this source tree (a test keeps the list equal to
/// the folder).
pub(crate) const ROLE_FILES: &[(&str, &[u8])] = &[
    (
        "roles/edge.smoke.yaml",
        include_bytes!("../../../roles/edge.smoke.yaml"),
    ),
    (
        "roles/edge/agent.yaml.tmpl",
        include_bytes!("../../../roles/edge/agent.yaml.tmpl"),
    ),
    (
        "roles/edge/geoip/GeoLite2-City.mmdb",
        include_bytes!("../../../roles/edge/geoip/GeoLite2-City.mmdb"),
    ),
    (
        "roles/edge/geoip/LICENSE-APACHE",
        include_bytes!("../../../roles/edge/geoip/LICENSE-APACHE"),
    ),
    (
        "roles/edge/geoip/LICENSE-MIT",
        include_bytes!("../../../roles/edge/geoip/LICENSE-MIT"),
    ),
    (
        "roles/edge/geoip/PROVENANCE.md",
        include_bytes!("../../../roles/edge/geoip/PROVENANCE.md"),
    ),
    (
        "roles/edge/logrotate.conf.tmpl",
        include_bytes!("../../../roles/edge/logrotate.conf.tmpl"),
    ),
    (
        "roles/edge/lua/cdn_router.lua",
        include_bytes!("../../../roles/edge/lua/cdn_router.lua"),
    ),
    (
        "roles/edge/lua/edge_decide.lua",
        include_bytes!("../../../roles/edge/lua/edge_decide.lua"),
    ),
    (
        "roles/edge/lua/edge_generation.lua",
        include_bytes!("../../../roles/edge/lua/edge_generation.lua"),
    ),
    (
        "roles/edge/lua/edge_ip.lua",
        include_bytes!("../../../roles/edge/lua/edge_ip.lua"),
    ),
    (
        "roles/edge/lua/edge_metrics.lua",
        include_bytes!("../../../roles/edge/lua/edge_metrics.lua"),
    ),
    (
        "roles/edge/lua/edge_norm.lua",
        include_bytes!("../../../roles/edge/lua/edge_norm.lua"),
    ),
    (
        "roles/edge/lua/edge_origins.lua",
        include_bytes!("../../../roles/edge/lua/edge_origins.lua"),
    ),
    (
        "roles/edge/lua/edge_redis.lua",
        include_bytes!("../../../roles/edge/lua/edge_redis.lua"),
    ),
    (
        "roles/edge/lua/edge_tables.lua",
        include_bytes!("../../../roles/edge/lua/edge_tables.lua"),
    ),
    (
        "roles/edge/lua/edge_tls.lua",
        include_bytes!("../../../roles/edge/lua/edge_tls.lua"),
    ),
    (
        "roles/edge/lua/edge_tls_pick.lua",
        include_bytes!("../../../roles/edge/lua/edge_tls_pick.lua"),
    ),
    (
        "roles/edge/nginx.conf.tmpl",
        include_bytes!("../../../roles/edge/nginx.conf.tmpl"),
    ),
    (
        "roles/edge/reads.json",
        include_bytes!("../../../roles/edge/reads.json"),
    ),
    (
        "roles/edge/redis-persistence.conf",
        include_bytes!("../../../roles/edge/redis-persistence.conf"),
    ),
];

const CLUSTER: &str = "\
# yaml-language-server: $schema=schemas/cluster.schema.json
# Cluster-wide settings (docs/configuration.md); every key is optional.
name: my-cdn
mqtt: {url: mqtt://127.0.0.1:1883, topic_prefix: edgeform}
";

const SITE: &str = "\
# yaml-language-server: $schema=../schemas/site.schema.json
# One site: its host, where the edge fetches from, whether it caches.
host: www.example.com
origin: http://192.0.2.10
cached: true
";

const ZONE: &str = "\
# yaml-language-server: $schema=../schemas/zone.schema.json
# Once a zone has a route, viewers outside every route are refused: this
# one takes every address.
name: world
routes: [0.0.0.0/0, \"::/0\"]
";

const NODE: &str = "\
# yaml-language-server: $schema=../schemas/node.schema.json
# One edge: its own Redis (what `apply` writes), its cache, and how
# `edgeform install` reaches it over SSH.
name: edge-1
roles: [edge]
region: world
zone: world
location: {lat: 52.37, lon: 4.9}
addresses: [198.51.100.1]
redis: {url: redis://127.0.0.1:6379}
cache:
  dirs: [/var/cache/edgeform/edge]
  levels: \"1:2\"
  key: $scheme://$host$request_uri
install:
  ssh: edge-1.example.net:22
  user: root
  root: /srv/edgeform
  listen: 0.0.0.0:80
  smoke_listen: 127.0.0.1:8443
  keep: 5
  vars:
    api: \"false\"
    api_url: http://127.0.0.1:9
    cache_max_size: 10g
    geoip_db: geoip/GeoLite2-City.mmdb
    resolver: 127.0.0.1
    ttl_hop_port: \"8480\"
    workers: auto
  candidate_vars: {ttl_hop_port: \"18480\"}
";

/// Write the repository into `dir` (made if absent; refused when it holds
/// anything) and commit it.
///
/// # Errors
/// `dir` not empty, a file not written, git.
pub fn init(dir: &Path) -> Result<u8> {
    if dir.exists() {
        let mut entries =
            std::fs::read_dir(dir).with_context(|| format!("reading {}", dir.display()))?;
        if entries.next().is_some() {
            bail!(
                "{} is not empty: init makes a new repository (give an empty or new folder)",
                dir.display()
            );
        }
    }
    let mut files: Vec<(String, Vec<u8>)> = vec![
        ("cluster.yaml".into(), CLUSTER.into()),
        ("sites/www.example.com.yaml".into(), SITE.into()),
        ("zones/world.yaml".into(), ZONE.into()),
        ("nodes/edge-1.yaml".into(), NODE.into()),
    ];
    for kind in [Kind::Site, Kind::Zone, Kind::Node, Kind::Cluster] {
        files.push((
            format!("schemas/{}", compiler::schema::file_name(kind)),
            compiler::schema::embedded(kind).into(),
        ));
    }
    files.extend(
        ROLE_FILES
            .iter()
            .map(|(name, bytes)| ((*name).to_owned(), bytes.to_vec())),
    );
    for (name, bytes) in &files {
        let path = dir.join(name);
        if let Some(parent) = path.parent() {
            std::fs::create_dir_all(parent)
                .with_context(|| format!("creating {}", parent.display()))?;
        }
        std::fs::write(&path, bytes).with_context(|| format!("writing {}", path.display()))?;
    }
    let commit = commit_all(dir).context("the first commit")?;
    println!(
        "initialized {}: {} files, first commit {}",
        dir.display(),
        files.len(),
        &commit[..12]
    );
    println!("next: edit nodes/edge-1.yaml and sites/, then `edgeform check` and `edgeform plan`");
    Ok(0)
}

/// `git init` and one commit of every file, as the user's git identity
/// (else `edgeform init`).
fn commit_all(dir: &Path) -> Result<String> {
    let repo = git2::Repository::init(dir)?;
    let mut index = repo.index()?;
    index.add_all(["*"], git2::IndexAddOption::DEFAULT, None)?;
    index.write()?;
    let tree = repo.find_tree(index.write_tree()?)?;
    let who = repo
        .signature()
        .or_else(|_| git2::Signature::now("edgeform init", "edgeform@localhost"))?;
    let oid = repo.commit(
        Some("HEAD"),
        &who,
        &who,
        "A new edgeform config repository (edgeform init)",
        &tree,
        &[],
    )?;
    Ok(oid.to_string())
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Every file under `roles/` is in the repository `init` writes, and
    /// nothing else: a new role file cannot be left out.
    #[test]
    fn the_role_files_are_the_folders() {
        let root = Path::new(env!("CARGO_MANIFEST_DIR")).join("..");
        let mut found = Vec::new();
        let mut stack = vec![root.join("roles")];
        while let Some(d) = stack.pop() {
            for e in std::fs::read_dir(&d).unwrap() {
                let p = e.unwrap().path();
                if p.is_dir() {
                    stack.push(p);
                } else {
                    found.push(
                        p.strip_prefix(&root)
                            .unwrap()
                            .to_string_lossy()
                            .into_owned(),
                    );
                }
            }
        }
        found.sort();
        let listed: Vec<&str> = ROLE_FILES.iter().map(|(n, _)| *n).collect();
        assert_eq!(listed, found);
    }
}
