//! `zones/*.yaml`: routes and fallback.

use super::*;

pub(super) fn zone(ctx: &mut Ctx<'_>, raw: &raw::Zone) -> Zone {
    let routes = check_nets(ctx, "routes", &raw.routes);
    let fallback = match raw.fallback.as_deref() {
        None | Some("none") => None,
        Some(name) => Some(name.to_owned()),
    };
    if fallback.as_deref() == Some(raw.name.as_str()) {
        ctx.warning(
            "fallback-to-self",
            "/fallback",
            format!(
                "zone `{}` falls back to itself; the chain ends there",
                raw.name
            ),
        );
    }
    Zone {
        file: ctx.file.path.clone(),
        name: raw.name.clone(),
        routes,
        fallback,
    }
}
