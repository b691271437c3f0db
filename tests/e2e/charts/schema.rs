//! The values schema (`values.schema.json`): `schema_refuses_bad_values`,
//! `schema_max_body_bytes_bounds_are_the_binarys`,
//! `every_bounded_integer_value_renders_at_its_edges_and_is_refused_past_them` and
//! `schema_max_mount_path_is_the_longest_pods_dir_with_a_budget`.
//!
//! What they prove: the schema refuses bad values, naming them; its bounds are the contract's and
//! the binaries' own (`controller.maxBodyBytes`, the longest pods dir with a budget); and every
//! bounded integer value renders at each of its edges and is refused one past it.

use aether_controller::webhook::MIN_MAX_BODY_BYTES;
use aether_crds::udspath::{Budget, FIXED_BYTES, MAX_PODS_DIR_BYTES, MIN_VALUE_BYTES, SUN_PATH_MAX};
use serde_json::Value;

use crate::template::{chart, container, find, flag, try_render};

pub(crate) fn schema_refuses_bad_values() {
    for (sets, needle) in [
        (&["webhook.timeoutSeconds=11"][..], "timeoutSeconds"),
        (&["webhook.failurePolicy=Maybe"][..], "failurePolicy"),
        (&["webhook.certs.mode=acme"][..], "mode"),
        (&["webhook.certs.mode=provided"][..], "caBundle"),
        (&["proxy.udsWorkloads.mountPath=/var/snap/microk8s/common/var/lib/kubelet/pods"][..], "mountPath"),
        (&["proxy.udsWorkloads.mountPath=relative/pods"][..], "mountPath"),
        (&["proxy.udsWorkloads.mountPath=/k/"][..], "mountPath"),
        (&["proxy.udsWorkloads.hostPodsDir="][..], "hostPodsDir"),
        (&["proxy.udsWorkloads.enabeld=true"][..], "enabeld"),
        (&["socketLimit=filesystm"][..], "socketLimit"),
    ] {
        match try_render(sets) {
            Ok(_) => panic!("{sets:?} rendered; the schema should refuse it"),
            Err(e) => assert!(e.contains(needle), "{sets:?}: error lacks {needle:?}: {e}"),
        }
    }
}

/// The schema's `controller.maxBodyBytes` bounds are the binary's own: `minimum` is
/// `aether_controller::webhook::MIN_MAX_BODY_BYTES` (what `run --max-body-bytes` refuses below,
/// so a value the schema lets through can no longer crash-loop the controller) and there is no
/// `maximum` (the binary has none). helm refuses one byte below the bound and renders the bound
/// itself into the flag.
pub(crate) fn schema_max_body_bytes_bounds_are_the_binarys() {
    let text = std::fs::read_to_string(chart("aether").join("values.schema.json")).expect("values.schema.json");
    let schema: Value = serde_json::from_str(&text).expect("the schema is JSON");
    let field = &schema["properties"]["controller"]["properties"]["maxBodyBytes"];
    assert_eq!(field["minimum"].as_u64(), Some(MIN_MAX_BODY_BYTES as u64), "{field}");
    assert!(field.get("maximum").is_none() && field.get("exclusiveMinimum").is_none(), "{field}");
    let description = field["description"].as_str().expect("a description");
    assert!(description.contains(&format!("at least {MIN_MAX_BODY_BYTES}")), "{description}");

    let below = format!("controller.maxBodyBytes={}", MIN_MAX_BODY_BYTES - 1);
    match try_render(&[below.as_str()]) {
        Ok(_) => panic!("{below} rendered; the schema should refuse it"),
        Err(e) => assert!(e.contains("maxBodyBytes") && e.contains("minimum"), "{below}: {e}"),
    }
    let exact = format!("controller.maxBodyBytes={MIN_MAX_BODY_BYTES}");
    let docs = try_render(&[exact.as_str()]).unwrap_or_else(|e| panic!("{exact} refused: {e}"));
    let c = container(&find(&docs, "Deployment", "aether-controller")["spec"]["template"]["spec"], "aether-controller");
    assert_eq!(flag(c, "--max-body-bytes"), Some(MIN_MAX_BODY_BYTES.to_string()));
}

/// `(values path, minimum, maximum)` of every integer value of `schema` with a bound, `$ref`s to
/// `#/definitions/...` followed.
fn bounded_integers(schema: &Value, node: &Value, path: &str, out: &mut Vec<(String, Option<i64>, Option<i64>)>) {
    let resolved;
    let node = match node["$ref"].as_str().and_then(|r| r.strip_prefix("#/definitions/")) {
        Some(name) => {
            resolved = schema["definitions"][name].clone();
            &resolved
        }
        None => node,
    };
    let (min, max) = (node["minimum"].as_i64(), node["maximum"].as_i64());
    if node["type"] == "integer" && (min.is_some() || max.is_some()) {
        out.push((path.to_owned(), min, max));
    }
    for (key, child) in node["properties"].as_object().into_iter().flatten() {
        let child_path = if path.is_empty() { key.clone() } else { format!("{path}.{key}") };
        bounded_integers(schema, child, &child_path, out);
    }
}

/// Every bounded integer value of charts/aether renders at each of its edges and
/// is refused one past it, with an error naming the value and the bound. The real-node suite runs
/// the chart with the values at their edges (`chart_values_at_their_edges_run_on_the_real_node`).
pub(crate) fn every_bounded_integer_value_renders_at_its_edges_and_is_refused_past_them() {
    let text = std::fs::read_to_string(chart("aether").join("values.schema.json")).expect("values.schema.json");
    let schema: Value = serde_json::from_str(&text).expect("the schema is JSON");
    let mut bounded = Vec::new();
    bounded_integers(&schema, &schema, "", &mut bounded);
    assert!(bounded.len() >= 25, "bounded integer values found: {bounded:?}");
    let mut checked = 0;
    for (path, min, max) in &bounded {
        let leaf = path.rsplit('.').next().expect("a path");
        for (edge, past, word) in [(*min, min.map(|m| m - 1), "minimum"), (*max, max.map(|m| m + 1), "maximum")] {
            let (Some(edge), Some(past)) = (edge, past) else { continue };
            let at = format!("{path}={edge}");
            try_render(&[at.as_str()]).unwrap_or_else(|e| panic!("{at} is within the schema but does not render: {e}"));
            let over = format!("{path}={past}");
            match try_render(&[over.as_str()]) {
                Ok(_) => panic!("{over} rendered; the schema's {word} is {edge}"),
                Err(e) => assert!(
                    e.contains(leaf) && e.contains(word),
                    "{over}: the error names neither {leaf} nor {word}: {e}"
                ),
            }
            checked += 1;
        }
    }
    eprintln!("{checked} edges of {} bounded values rendered and refused one past", bounded.len());
}

/// A mount path of `len` bytes (`/` and `len - 1` letters).
pub(crate) fn mount_path_of(len: usize) -> String {
    format!("/{}", "p".repeat(len - 1))
}

/// The schema's `maxLength` of `proxy.udsWorkloads.mountPath` is the contract crate's longest
/// pods dir with a budget (`aether_crds::udspath::MAX_PODS_DIR_BYTES`), not a hand-derived copy:
/// helm accepts that length and refuses one byte more, exactly where `Budget::new` does.
pub(crate) fn schema_max_mount_path_is_the_longest_pods_dir_with_a_budget() {
    let text = std::fs::read_to_string(chart("aether").join("values.schema.json")).expect("values.schema.json");
    let schema: Value = serde_json::from_str(&text).expect("the schema is JSON");
    let uds = &schema["properties"]["proxy"]["properties"]["udsWorkloads"];
    assert_eq!(uds["allOf"][0]["properties"]["mountPath"]["maxLength"].as_u64(), Some(MAX_PODS_DIR_BYTES as u64));
    let description = uds["properties"]["mountPath"]["description"].as_str().expect("a description");
    for said in [
        format!("{SUN_PATH_MAX} - len(mountPath) - {FIXED_BYTES} bytes"),
        format!("at most {MAX_PODS_DIR_BYTES} bytes"),
        format!("budget >= {MIN_VALUE_BYTES}"),
    ] {
        assert!(description.contains(&said), "the mountPath description lacks {said:?}: {description}");
    }

    let longest = mount_path_of(MAX_PODS_DIR_BYTES);
    assert_eq!(Budget::new(&longest).map(|b| b.bytes()), Ok(MIN_VALUE_BYTES), "{longest}");
    let set = format!("proxy.udsWorkloads.mountPath={longest}");
    try_render(&[set.as_str()]).unwrap_or_else(|e| panic!("{longest} ({MAX_PODS_DIR_BYTES} bytes) refused: {e}"));
    let too_long = mount_path_of(MAX_PODS_DIR_BYTES + 1);
    assert!(Budget::new(&too_long).is_err(), "{too_long}");
    let set = format!("proxy.udsWorkloads.mountPath={too_long}");
    match try_render(&[set.as_str()]) {
        Ok(_) => panic!("{too_long} ({} bytes) rendered; the schema should refuse it", too_long.len()),
        Err(e) => assert!(e.contains("mountPath"), "{e}"),
    }
}
