//! Prints the EndpointPolicy CustomResourceDefinition as YAML.
//!
//! `crdgen` prints the plain CRD; `crdgen --chart` prints the copy kept in
//! `charts/aether-crds/templates/`, which adds only chart metadata (labels and the
//! `helm.sh/resource-policy: keep` annotation, so uninstalling the chart never deletes users'
//! policies) and lets `spec.udsSocket`'s length rule (`size(bytes(self)) <= n`) follow the chart
//! value `socketLimit` (36
//! bytes for `sunPath`, the default, 319 for `filesystem`; the Helm actions sit in YAML comments,
//! so the unrendered file is the default CRD). `make crds` writes that copy; a test fails when it
//! drifts, and the chart tests compare what `helm template` renders.

fn main() {
    let args: Vec<String> = std::env::args().skip(1).collect();
    match args.as_slice() {
        [] => print!("{}", aether_crds::crd_yaml()),
        [flag] if flag == "--chart" => print!("{}", aether_crds::chart::crd_for_chart()),
        _ => {
            eprintln!(
                "usage: crdgen [--chart]\n  prints the EndpointPolicy CRD as YAML; --chart adds the chart's labels and keep annotation and the socketLimit template"
            );
            std::process::exit(2);
        }
    }
}
