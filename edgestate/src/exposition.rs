//! The two metrics exposition formats, chosen by the scraper's `Accept`:
//! `prometheus_client` writes OpenMetrics, which Prometheus asks for; a
//! client that does not ask for it (`curl`, `promtool check metrics`,
//! node_exporter's textfile collector) gets the Prometheus text format
//! 0.0.4. Pure: text in, text out.

/// OpenMetrics 1.0.0's content type.
pub const OPENMETRICS: &str = "application/openmetrics-text; version=1.0.0; charset=utf-8";
/// The Prometheus text format's content type.
pub const TEXT: &str = "text/plain; version=0.0.4; charset=utf-8";

/// Whether `accept` asks for OpenMetrics (with a quality above zero).
#[must_use]
pub fn wants_openmetrics(accept: Option<&str>) -> bool {
    accept.is_some_and(|a| accepts(a, "application/openmetrics-text"))
}

/// Whether one `Accept` header value names `media` (a `type/subtype`,
/// compared without regard to case) with a quality above zero. Only the
/// exact media type counts: `*/*` or `application/*` asks for whatever the
/// server answers by default, and `application/jsonx` is not
/// `application/json`.
#[must_use]
pub fn accepts(accept: &str, media: &str) -> bool {
    accept.split(',').any(|range| {
        let mut parts = range.split(';').map(str::trim);
        let named = parts.next().unwrap_or_default();
        let q = parts
            .filter_map(|p| {
                let (k, v) = p.split_once('=')?;
                k.trim().eq_ignore_ascii_case("q").then(|| v.trim())
            })
            .find_map(|q| q.parse::<f32>().ok())
            .unwrap_or(1.0);
        named.eq_ignore_ascii_case(media) && q > 0.0
    })
}

/// The content type and body for `accept`, from `openmetrics` text.
#[must_use]
pub fn negotiate(accept: Option<&str>, openmetrics: String) -> (&'static str, String) {
    if wants_openmetrics(accept) {
        (OPENMETRICS, openmetrics)
    } else {
        (TEXT, to_text(&openmetrics))
    }
}

/// OpenMetrics text → the Prometheus text format (0.0.4): no `# EOF` or
/// `# UNIT`, and a counter's `HELP`/`TYPE` name its `_total` samples.
#[must_use]
pub fn to_text(openmetrics: &str) -> String {
    let counters: std::collections::BTreeSet<&str> = openmetrics
        .lines()
        .filter_map(|l| l.strip_prefix("# TYPE "))
        .filter_map(|l| l.strip_suffix(" counter"))
        .collect();
    let mut out = String::with_capacity(openmetrics.len());
    for line in openmetrics.lines() {
        if line == "# EOF" || line.starts_with("# UNIT ") {
            continue;
        }
        let renamed = ["# HELP ", "# TYPE "].iter().find_map(|p| {
            let rest = line.strip_prefix(p)?;
            let (name, tail) = rest.split_once(' ')?;
            counters
                .contains(name)
                .then(|| format!("{p}{name}_total {tail}"))
        });
        match renamed {
            Some(l) => out.push_str(&l),
            None => out.push_str(line),
        }
        out.push('\n');
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn prometheus_gets_openmetrics_and_anyone_else_the_text_format() {
        let prometheus = "application/openmetrics-text;version=1.0.0,application/openmetrics-text;\
                          version=0.0.1;q=0.75,text/plain;version=0.0.4;q=0.5,*/*;q=0.1";
        assert!(wants_openmetrics(Some(prometheus)));
        assert!(!wants_openmetrics(Some("*/*")));
        assert!(!wants_openmetrics(None));
        assert!(!wants_openmetrics(Some("application/openmetrics-text;q=0")));
        assert!(!wants_openmetrics(Some(
            "application/openmetrics-text; Q=0.0"
        )));
        assert!(accepts(
            "text/html, Application/JSON;q=0.5",
            "application/json"
        ));
        assert!(!accepts("application/jsonx", "application/json"));
        assert!(!accepts(
            "text/plain; x=application/json",
            "application/json"
        ));
        assert!(!accepts("application/json;q=0", "application/json"));
        let om = "# HELP a_jobs Jobs.\n# TYPE a_jobs counter\na_jobs_total 3\n\
                  # HELP a_up Up.\n# TYPE a_up gauge\na_up 1\n# EOF\n";
        let (ty, body) = negotiate(Some("*/*"), om.to_owned());
        assert_eq!(ty, TEXT);
        assert_eq!(
            body,
            "# HELP a_jobs_total Jobs.\n# TYPE a_jobs_total counter\na_jobs_total 3\n\
             # HELP a_up Up.\n# TYPE a_up gauge\na_up 1\n"
        );
        assert_eq!(
            negotiate(Some(prometheus), om.to_owned()),
            (OPENMETRICS, om.to_owned())
        );
    }
}
