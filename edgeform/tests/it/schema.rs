//! The committed schemas in `schemas/` are exactly what the raw model
//! generates. `EDGEFORM_BLESS=1 cargo test` rewrites them.

use compiler::load::Kind;
use compiler::schema;

#[test]
fn committed_schemas_match_the_model() {
    let dir = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../schemas");
    let bless = std::env::var_os("EDGEFORM_BLESS").is_some();
    let mut stale = Vec::new();
    for kind in [Kind::Cluster, Kind::Site, Kind::Zone, Kind::Node] {
        let path = dir.join(schema::file_name(kind));
        let generated = schema::generate_text(kind);
        let committed = std::fs::read_to_string(&path).unwrap_or_default();
        if committed != generated {
            if bless {
                std::fs::write(&path, &generated).unwrap();
            } else {
                stale.push(path.display().to_string());
            }
        }
        // The embedded copy is the committed one (rebuild after blessing).
        if !bless {
            assert_eq!(
                schema::embedded(kind),
                committed,
                "{kind:?}: rebuild to embed"
            );
        }
    }
    assert!(
        stale.is_empty(),
        "schemas differ from the model: {stale:?}; run `EDGEFORM_BLESS=1 cargo test` and commit"
    );
}

#[test]
fn schemas_are_draft_2020_12_and_compile() {
    for kind in [Kind::Cluster, Kind::Site, Kind::Zone, Kind::Node] {
        let v: serde_json::Value = serde_json::from_str(schema::embedded(kind)).unwrap();
        assert_eq!(v["$schema"], "https://json-schema.org/draft/2020-12/schema");
        let _ = schema::validator(kind);
    }
}

#[test]
fn configuration_reference_is_generated_from_the_schemas() {
    let path = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../docs/configuration.md");
    let generated = schema::reference_markdown();
    if std::env::var_os("EDGEFORM_BLESS").is_some() {
        std::fs::write(&path, &generated).unwrap();
    }
    let committed = std::fs::read_to_string(&path).unwrap_or_default();
    assert!(
        committed == generated,
        "docs/configuration.md is stale; run `EDGEFORM_BLESS=1 cargo test` and commit"
    );
}
