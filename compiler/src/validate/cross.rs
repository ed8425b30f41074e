//! Cross-file rules: unique hosts, zones and nodes, references (zones, regions), route coverage, operator hints.

use super::*;

pub(super) fn located(file: &ParsedFile, pointer: &str) -> String {
    let s = file.locate(pointer);
    format!("{}:{}:{}", file.path, s.line, s.column)
}

pub(super) fn unique_hosts(sites: &[(Site, &ParsedFile)], out: &mut Vec<Diagnostic>) {
    // Where a name was first seen: the site's index, and 0 for `host` or
    // `i + 1` for `aliases[i]` (the pointer is only written out for a
    // duplicate). Two `u32`s, not a file reference and an `Option<usize>`:
    // at 1,000,000 sites the map holds ~1.64 M names.
    let names = sites.iter().map(|(s, _)| 1 + s.aliases.len()).sum();
    let mut seen: HashMap<&str, (u32, u32)> = HashMap::with_capacity(names);
    let pointer = |at: u32| match at {
        0 => "/host".to_owned(),
        i => format!("/aliases/{}", i - 1),
    };
    for ((site, file), index) in sites.iter().zip(0u32..) {
        let names =
            std::iter::once(site.host.as_str()).chain(site.aliases.iter().map(String::as_str));
        for (name, at) in names.zip(0u32..) {
            match seen.get(name) {
                Some(&(first, _)) if first == index => {} // reported by the per-file rule
                Some(&(first, first_at)) => out.push(
                    Diagnostic::error(
                        "duplicate-host",
                        &file.path,
                        file.locate(&pointer(at)),
                        format!(
                            "host `{name}` is already served by {}",
                            located(sites[first as usize].1, &pointer(first_at))
                        ),
                    )
                    .with_help("a hostname (host or alias) may belong to one site only"),
                ),
                None => {
                    seen.insert(name, (index, at));
                }
            }
        }
    }
}

pub(super) fn unique_zones<'a>(
    zones: &'a [(Zone, &ParsedFile)],
    out: &mut Vec<Diagnostic>,
) -> BTreeSet<&'a str> {
    let mut seen: BTreeMap<&str, &ParsedFile> = BTreeMap::new();
    for (zone, file) in zones {
        if let Some(first) = seen.get(zone.name.as_str()) {
            out.push(Diagnostic::error(
                "duplicate-zone",
                &file.path,
                file.locate("/name"),
                format!(
                    "zone `{}` is already defined in {}",
                    zone.name,
                    located(first, "/name")
                ),
            ));
        } else {
            seen.insert(&zone.name, file);
        }
    }
    seen.into_keys().collect()
}

pub(super) fn unique_nodes(nodes: &[(Node, &ParsedFile)], out: &mut Vec<Diagnostic>) {
    let mut seen: BTreeMap<&str, &ParsedFile> = BTreeMap::new();
    let mut addresses: HashMap<IpAddr, (&str, &ParsedFile, usize)> = HashMap::new();
    for (node, file) in nodes {
        if let Some(first) = seen.get(node.name.as_str()) {
            out.push(Diagnostic::error(
                "duplicate-node",
                &file.path,
                file.locate("/name"),
                format!(
                    "node `{}` is already defined in {}",
                    node.name,
                    located(first, "/name")
                ),
            ));
        } else {
            seen.insert(&node.name, file);
        }
        for (i, addr) in node.addresses.iter().enumerate() {
            if let Some((other, other_file, j)) = addresses.get(addr) {
                out.push(Diagnostic::error(
                    "duplicate-address",
                    &file.path,
                    file.locate(&format!("/addresses/{i}")),
                    format!(
                        "address `{addr}` also belongs to node `{other}` ({})",
                        located(other_file, &format!("/addresses/{j}"))
                    ),
                ));
            } else {
                addresses.insert(*addr, (&node.name, file, i));
            }
        }
    }
}

/// A `tls: {acme: true}` site needs the CA it is issued by: `cluster.yaml`
/// `acme`.
pub(super) fn acme_sites_have_a_ca(
    sites: &[(Site, &ParsedFile)],
    cluster: &Cluster,
    out: &mut Vec<Diagnostic>,
) {
    if cluster.acme.is_some() {
        return;
    }
    for (site, file) in sites {
        if let Some(Tls::Acme(_)) = &site.tls {
            out.push(
                Diagnostic::error(
                    "acme-without-ca",
                    &file.path,
                    file.locate("/tls"),
                    format!(
                        "site `{}` has `tls: {{acme: true}}` but cluster.yaml has no `acme` \
                         (the CA that issues its certificate)",
                        site.host
                    ),
                )
                .with_help(
                    "add to cluster.yaml: `acme: {directory: https://<CA>/directory, contact: \
                     [\"mailto:you@example.com\"]}`, or import a certificate and write \
                     `tls: {certificate: NAME}`",
                ),
            );
        }
    }
}

pub(super) fn references(
    sites: &[(Site, &ParsedFile)],
    zones: &[(Zone, &ParsedFile)],
    nodes: &[(Node, &ParsedFile)],
    zone_names: &BTreeSet<&str>,
    out: &mut Vec<Diagnostic>,
) {
    let unknown_zone = |name: &str, file: &ParsedFile, pointer: &str, what: &str| {
        let mut d = Diagnostic::error(
            "unknown-zone",
            &file.path,
            file.locate(pointer),
            format!("{what} `{name}` names no zone"),
        );
        let known: Vec<&str> = zone_names.iter().copied().collect();
        d.help = Some(did_you_mean(
            name,
            &known,
            "known zones",
            Some("no zones are defined (zones/*.yaml)"),
        ));
        d
    };
    for (zone, file) in zones {
        if let Some(f) = &zone.fallback
            && !zone_names.contains(f.as_str())
        {
            out.push(unknown_zone(f, file, "/fallback", "fallback"));
        }
    }
    let regions: BTreeSet<&str> = nodes.iter().map(|(n, _)| n.region.as_str()).collect();
    for (node, file) in nodes {
        if let Some(z) = &node.zone
            && !zone_names.contains(z.as_str())
        {
            out.push(unknown_zone(z, file, "/zone", "zone"));
        }
    }
    for (site, file) in sites {
        let Some(wanted) = &site.regions else {
            continue;
        };
        for (i, region) in wanted.iter().enumerate() {
            if !regions.contains(region.as_str()) {
                let known: Vec<&str> = regions.iter().copied().collect();
                let mut d = Diagnostic::error(
                    "unknown-region",
                    &file.path,
                    file.locate(&format!("/regions/{i}")),
                    format!("region `{region}` has no node"),
                );
                d.help = Some(did_you_mean(region, &known, "regions with nodes", None));
                out.push(d);
            }
        }
    }
    // Operator hints.
    let has_router = nodes.iter().any(|(n, _)| n.has(Role::Router));
    for (node, file) in nodes {
        if node.has(Role::Edge) && node.redis.is_none() {
            out.push(
                Diagnostic::warning(
                    "edge-without-redis",
                    &file.path,
                    file.locate("/name"),
                    format!(
                        "edge `{}` has no `redis` block, so it receives no sites",
                        node.name
                    ),
                )
                .with_help("every edge reads its sites from its own Redis; add `redis`"),
            );
        }
        if has_router && node.has(Role::Edge) && node.addresses.is_empty() {
            out.push(Diagnostic::warning(
                "edge-without-address",
                &file.path,
                file.locate("/name"),
                format!(
                    "edge `{}` has no `addresses`, so no router pool includes it",
                    node.name
                ),
            ));
        }
    }
    // Routers' pools hold public addresses only.
    let any_public_edge = nodes.iter().any(|(n, _)| {
        n.has(Role::Edge)
            && n.addresses
                .iter()
                .any(|a| edgestate::routing::is_public(*a))
    });
    if !any_public_edge {
        for (node, file) in nodes.iter().filter(|(n, _)| n.has(Role::Router)) {
            out.push(
                Diagnostic::warning(
                    "router-pool-empty",
                    &file.path,
                    file.locate("/name"),
                    format!(
                        "router `{}` has an empty 443 pool: no edge has a public address",
                        node.name
                    ),
                )
                .with_help(
                    "private, loopback, link-local and CGNAT addresses are left out of \
                     public pools; its nginx stream file listens on nothing",
                ),
            );
        }
    }
}

/// Whether the union of `nets` covers its whole address family.
pub(super) fn covers_all(nets: &[IpNet], v4: bool) -> bool {
    let family: Vec<IpNet> = nets
        .iter()
        .filter(|n| matches!(n, IpNet::V4(_)) == v4)
        .copied()
        .collect();
    if family.iter().any(|n| n.prefix_len() == 0) {
        return true;
    }
    let merged = IpNet::aggregate(&family);
    merged.iter().any(|n| n.prefix_len() == 0)
}

pub(super) fn routes(
    zones: &[(Zone, &ParsedFile)],
    nodes: &[(Node, &ParsedFile)],
    out: &mut Vec<Diagnostic>,
) {
    let mut owner: HashMap<IpNet, (&str, &ParsedFile, usize)> = HashMap::new();
    let mut all = Vec::new();
    for (zone, file) in zones {
        for (i, net) in zone.routes.iter().enumerate() {
            all.push(*net);
            if let Some((other, other_file, j)) = owner.get(net) {
                if *other != zone.name {
                    out.push(Diagnostic::error(
                        "duplicate-route",
                        &file.path,
                        file.locate(&format!("/routes/{i}")),
                        format!(
                            "route `{net}` is already in zone `{other}` ({})",
                            located(other_file, &format!("/routes/{j}"))
                        ),
                    )
                    .with_help("a prefix may belong to one zone only; the longest prefix wins, so use a more specific one"));
                }
            } else {
                owner.insert(*net, (&zone.name, file, i));
            }
        }
    }
    if all.is_empty() {
        return; // unrestricted routing: no coverage rules apply
    }
    let first_route_file = zones
        .iter()
        .find(|(z, _)| !z.routes.is_empty())
        .map(|(_, f)| *f);
    for (v4, all_net) in [(true, "0.0.0.0/0"), (false, "::/0")] {
        if !covers_all(&all, v4) {
            let file = first_route_file.expect("routes exist");
            out.push(
                Diagnostic::warning(
                    "uncovered-default-route",
                    &file.path,
                    file.locate("/routes"),
                    format!(
                        "routing is restricted but `{all_net}` is not covered: {} viewers outside \
                         every route are refused",
                        if v4 { "IPv4" } else { "IPv6" }
                    ),
                )
                .with_help(format!("add `{all_net}` to a catch-all zone's routes")),
            );
        }
    }
    let zoned: BTreeSet<&str> = nodes
        .iter()
        .filter_map(|(n, _)| n.zone.as_deref())
        .collect();
    for (zone, file) in zones {
        if !zone.routes.is_empty() && !zoned.contains(zone.name.as_str()) {
            out.push(
                Diagnostic::warning(
                    "empty-zone",
                    &file.path,
                    file.locate("/name"),
                    format!("zone `{}` has routes but no nodes: its viewers go straight to its fallback", zone.name),
                )
                .with_help("set `zone:` on the nodes that should serve it"),
            );
        }
    }
    for (node, file) in nodes {
        let plays = [Role::Edge, Role::Ingest, Role::Origin]
            .iter()
            .any(|r| node.has(*r));
        if plays && node.zone.is_none() {
            out.push(
                Diagnostic::warning(
                    "unzoned-node",
                    &file.path,
                    file.locate("/name"),
                    format!("node `{}` is in no zone while routing is restricted: it can never serve playback", node.name),
                )
                .with_help("set `zone:` on the node, or remove every zone route"),
            );
        }
    }
}
