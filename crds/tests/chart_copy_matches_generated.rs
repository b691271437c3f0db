//! The CRD committed in the chart must equal what `crdgen --chart` prints: edit
//! crds/src/policy.rs and run `make crds`, never the YAML.

#[test]
fn chart_crd_equals_crdgen_output() {
    let path = concat!(env!("CARGO_MANIFEST_DIR"), "/../charts/aether-crds/templates/endpointpolicy-crd.yaml");
    let committed = std::fs::read_to_string(path).expect("charts/aether-crds/templates/endpointpolicy-crd.yaml exists");
    assert!(
        committed == aether_crds::chart::crd_for_chart(),
        "charts/aether-crds/templates/endpointpolicy-crd.yaml drifted from the generated CRD: run `make crds`"
    );
}
