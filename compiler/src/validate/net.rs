//! Networks: parsing (host bits clear, a bare address is a host route)
//! and the one report of a bad network, for every list and field.

use super::*;

pub(super) enum NetError {
    Invalid,
    HostBits(IpNet),
}

/// A CIDR with host bits clear; a bare address is a host route (/32, /128).
pub(super) fn parse_net(text: &str) -> Result<IpNet, NetError> {
    let net: IpNet = match text.parse() {
        Ok(n) => n,
        Err(_) => match text.parse::<IpAddr>() {
            Ok(addr) => IpNet::from(addr),
            Err(_) => return Err(NetError::Invalid),
        },
    };
    if net.trunc() == net {
        Ok(net)
    } else {
        Err(NetError::HostBits(net.trunc()))
    }
}

/// Parse one network, reporting a bad one at `pointer`.
pub(super) fn net_at(ctx: &mut Ctx<'_>, pointer: &str, text: &str) -> Option<IpNet> {
    parse_net(text.trim())
        .map_err(|e| report(ctx, pointer, text, &e))
        .ok()
}

/// The one report of a network that does not parse or has host bits set.
fn report(ctx: &mut Ctx<'_>, pointer: &str, text: &str, e: &NetError) {
    match e {
        NetError::Invalid => {
            let d = ctx.error(
                "invalid-cidr",
                pointer,
                format!("`{text}` is not an IPv4 or IPv6 network"),
            );
            help(
                d,
                "write a CIDR such as `198.51.100.0/24` or `2001:db8::/32`",
            );
        }
        NetError::HostBits(network) => {
            let d = ctx.error(
                "cidr-host-bits",
                pointer,
                format!("`{text}` has host bits set; the network is `{network}`"),
            );
            help(
                d,
                format!("write `{network}`, or a longer prefix if you meant a host"),
            );
        }
    }
}

/// A list of networks (`ip_list`, `routes`, `trusted_proxies`): each
/// parsed, bad ones and duplicates reported.
pub(super) fn check_nets(ctx: &mut Ctx<'_>, field: &str, list: &[String]) -> Vec<IpNet> {
    let mut out = Vec::with_capacity(list.len());
    let mut seen: HashMap<IpNet, usize> = HashMap::new();
    for (i, text) in list.iter().enumerate() {
        let pointer = format!("/{field}/{i}");
        match parse_net(text.trim()) {
            Ok(net) => {
                if let Some(first) = seen.insert(net, i) {
                    ctx.error(
                        if field == "routes" {
                            "duplicate-route"
                        } else {
                            "duplicate-value"
                        },
                        &pointer,
                        format!("`{net}` is listed twice in `{field}` (also item {first})"),
                    );
                }
                out.push(net);
            }
            Err(e) => report(ctx, &pointer, text, &e),
        }
    }
    out
}
