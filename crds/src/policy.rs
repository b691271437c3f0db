//! The `EndpointPolicy` custom resource (`config.aether.io/v1`; docs/endpointpolicy.md).
//!
//! Every field carries a doc comment: kube-derive copies them into the CRD's OpenAPI schema, so
//! they are what `kubectl explain endpointpolicy.spec` prints. The schema rejects bad *shapes*
//! even when the admission webhook is not registered; the webhook adds the rules that depend on
//! configuration (the sun_path budget) and names the field and the rule.
//!
//! Every shape rule of a string field is a CEL rule with a message (`x-kubernetes-validations`),
//! none an OpenAPI `enum`, `maxLength` or `pattern`: kube-apiserver runs no CEL rule of an object
//! once an `enum`, `maxLength`, `required` or type check of it fails, and then adds
//! `<nil>: Invalid value: null: some validation rules were not checked because the object was
//! invalid` after the real errors (apiextensions-apiserver `hasBlockingErr`, v1.37). With rules
//! only, `kubectl apply` lists every broken field, each with its value and what to fix. A missing
//! required field or a wrong type still stops the rules: those checks come first by design.

use k8s_openapi::apimachinery::pkg::apis::meta::v1::Condition;
use kube::CustomResource;
use kube::KubeSchema;
use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

use crate::udspath::{FILESYSTEM_VALUE_MAX, SocketLimit};

/// The API group of EndpointPolicy.
pub const GROUP: &str = "config.aether.io";
/// The served and stored API version.
pub const VERSION: &str = "v1";
/// The kind.
pub const KIND: &str = "EndpointPolicy";
/// The resource (plural) name, as in RBAC rules and webhook rules.
pub const PLURAL: &str = "endpointpolicies";

/// Pattern of a DNS-1035 label (Service names): starts with a letter, ends alphanumeric.
pub const DNS1035_LABEL_PATTERN: &str = "^[a-z]([-a-z0-9]*[a-z0-9])?$";

/// The CRD's CEL rule for `spec.targetRef.name`: at most 63 characters and
/// [`DNS1035_LABEL_PATTERN`] (as a CEL raw string). The length is checked first, so the regex
/// never runs over a long value (the schema has no `maxLength`, see the module doc).
pub const SERVICE_NAME_RULE: &str = "size(self) <= 63 && self.matches(r'^[a-z]([-a-z0-9]*[a-z0-9])?$')";
/// The message the API server prints when [`SERVICE_NAME_RULE`] fails.
pub const SERVICE_NAME_MESSAGE: &str = "must be a Service name, a DNS-1035 label: 1-63 of lowercase a-z, 0-9 and '-', starting with a letter and ending with a letter or digit";

/// The CRD's CEL rule for `spec.targetRef.group` (in place of an `enum`, see the module doc).
pub const GROUP_RULE: &str = "self == '' || self == 'core'";
/// The message the API server prints when [`GROUP_RULE`] fails.
pub const GROUP_MESSAGE: &str = "must be \"\" or \"core\": the core API group, where Services live";

/// The CRD's CEL rule for `spec.targetRef.kind` (in place of an `enum`, see the module doc).
pub const KIND_RULE: &str = "self == 'Service'";
/// The message the API server prints when [`KIND_RULE`] fails.
pub const KIND_MESSAGE: &str = "must be \"Service\": a policy attaches to a Service of the core group only";

/// Pattern of a socket value `<volume>/<file>`: a DNS-1123 label, one `/`, and a file name of
/// `[A-Za-z0-9._-]` that is not `.` or `..` (RE2 has no look-ahead, hence the three branches).
/// The CRD checks it with the CEL rule [`SOCKET_RULE`], whose message says what to fix (a
/// `pattern` would make the API server print the bare regex).
pub const SOCKET_PATTERN: &str = r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?/([A-Za-z0-9_-][A-Za-z0-9._-]*|\.[A-Za-z0-9_-][A-Za-z0-9._-]*|\.\.[A-Za-z0-9._-]+)$";

/// The CRD's CEL grammar rule for `spec.udsSocket`: [`SOCKET_PATTERN`] as a CEL raw string, for
/// values of at most [`FILESYSTEM_VALUE_MAX`] (319) characters. A longer value fails the length
/// rule ([`socket_length_rule`]) under every limit; skipping the regex for it keeps a value of
/// megabytes within the API server's CEL cost limit (it would otherwise be refused with
/// "call cost exceeds limit" instead of our message).
pub const SOCKET_RULE: &str = r"size(self) > 319 || self.matches(r'^[a-z0-9]([-a-z0-9]*[a-z0-9])?/([A-Za-z0-9_-][A-Za-z0-9._-]*|\.[A-Za-z0-9_-][A-Za-z0-9._-]*|\.\.[A-Za-z0-9._-]+)$')";
/// The message the API server prints when [`SOCKET_RULE`] fails.
pub const SOCKET_MESSAGE: &str = "must be <volume>/<file> with exactly one '/': <volume> a DNS-1123 label (lowercase a-z, 0-9, '-'; the name of one of the pod's emptyDir volumes), <file> 1 or more of A-Z a-z 0-9 . _ - and not '.' or '..', e.g. sockets/app.sock";

// The grammar rule's guard is the file-system limit, written out in SOCKET_RULE.
const _: () = assert!(FILESYSTEM_VALUE_MAX == 319);

/// The CRD's CEL length rule for `spec.udsSocket` under `limit`: at most
/// [`SocketLimit::longest_value`] bytes (36 under `sunPath`, 319 under `filesystem`), counted in
/// bytes (`size(bytes(self))`). The generated CRD carries the `sunPath` rule; the CRD chart
/// renders the one its `socketLimit` value selects ([`crate::chart`]). The admission webhook
/// enforces the configured pods dir's budget within it.
pub fn socket_length_rule(limit: SocketLimit) -> kube::core::Rule {
    let max = limit.longest_value();
    let message = match limit {
        SocketLimit::SunPath => format!(
            "must be at most {max} bytes: no pods dir leaves room for a longer <volume>/<file> in sun_path (107 \
             bytes); the admission webhook enforces the configured pods dir's budget (16 bytes with \
             /var/lib/kubelet/pods)"
        ),
        SocketLimit::Filesystem => format!(
            "must be at most {max} bytes: a volume name of up to 63 bytes, '/' and a file name of up to 255 bytes \
             (NAME_MAX; the CRD chart's socketLimit is filesystem)"
        ),
    };
    kube::core::Rule::new(format!("size(bytes(self)) <= {max}")).message(message.as_str())
}

/// Declares, for every pod behind one Service, that the node proxy delivers inbound traffic over
/// a Unix domain socket the app serves in one of its emptyDir volumes, instead of TCP loopback.
/// A pod's own `endpoint.aether.io/uds-socket` annotation takes precedence over this policy. At
/// most one policy applies per Service: when several target the same Service, the one with the
/// lexicographically smallest name wins and the others are reported as conflicted.
#[derive(CustomResource, Serialize, Deserialize, Clone, Debug, PartialEq, Eq, KubeSchema, garde::Validate)]
#[kube(
    group = "config.aether.io",
    version = "v1",
    kind = "EndpointPolicy",
    plural = "endpointpolicies",
    shortname = "epol",
    category = "aether",
    namespaced,
    doc = "EndpointPolicy attaches Unix-domain-socket delivery to a Service: the node proxy delivers inbound traffic to the Service's pods over the socket named in spec.udsSocket instead of TCP loopback.",
    status = "EndpointPolicyStatus",
    printcolumn = r#"{"name":"Target","type":"string","description":"The Service this policy attaches to.","jsonPath":".spec.targetRef.name"}"#,
    printcolumn = r#"{"name":"Socket","type":"string","description":"The <volume>/<file> socket value.","jsonPath":".spec.udsSocket"}"#,
    printcolumn = r#"{"name":"Accepted","type":"string","description":"Whether the policy is in effect.","jsonPath":".status.conditions[?(@.type==\"Accepted\")].status"}"#,
    printcolumn = r#"{"name":"Reason","type":"string","description":"Why the policy is or is not in effect: Accepted, AcceptedWithoutService (in effect by ServiceAccount; no Service of that name exists), Invalid or Conflicted.","jsonPath":".status.conditions[?(@.type==\"Accepted\")].reason"}"#,
    printcolumn = r#"{"name":"Age","type":"date","jsonPath":".metadata.creationTimestamp"}"#,
    printcolumn = r#"{"name":"Message","type":"string","priority":1,"description":"The Accepted condition's message: the rule an invalid spec breaks, the missing Service, or the winning policy.","jsonPath":".status.conditions[?(@.type==\"Accepted\")].message"}"#
)]
#[serde(rename_all = "camelCase")]
#[garde(context(crate::udspath::Budget))]
pub struct EndpointPolicySpec {
    /// The Service this policy attaches to, in the policy's own namespace (Gateway API policy
    /// attachment, GEP-713 direct attachment). It carries no namespace: cross-namespace
    /// attachment is not possible. The Service name is matched against the mesh service key
    /// `<namespace>/<name>`, whose name is the workload's ServiceAccount: the policy applies to
    /// the pods running as that ServiceAccount whether or not the Service exists (the status
    /// says AcceptedWithoutService while it does not).
    #[garde(dive)]
    pub target_ref: TargetRef,

    /// The Unix socket the pods serve on, as `<volume>/<file>`: `<volume>` is the name of one of
    /// the pod's emptyDir volumes (a DNS-1123 label), `<file>` the socket file the app creates in
    /// it (1 or more of A-Z a-z 0-9 . _ -, not "." or ".."). Exactly one "/". The node proxy dials
    /// `<kubelet-pods-dir>/<pod-uid>/volumes/kubernetes.io~empty-dir/<volume>/<file>`, which must
    /// fit in sun_path (107 bytes): with the default pods dir /var/lib/kubelet/pods the value may
    /// be at most 16 bytes. The admission webhook enforces the budget for the configured pods dir.
    /// Example: "sockets/app.sock".
    #[x_kube(validation = socket_length_rule(SocketLimit::SunPath))]
    #[x_kube(validation = Rule::new(SOCKET_RULE).message(SOCKET_MESSAGE))]
    #[garde(custom(crate::field_rules::socket_rule))]
    pub uds_socket: String,
}

/// A reference to the Service a policy attaches to (GEP-713 `LocalPolicyTargetReference`,
/// restricted to core Services).
#[derive(Serialize, Deserialize, Clone, Debug, PartialEq, Eq, KubeSchema, garde::Validate)]
#[serde(rename_all = "camelCase")]
#[garde(context(crate::udspath::Budget))]
pub struct TargetRef {
    /// The API group of the target: "" or "core", both meaning the core group (Services live
    /// there). Defaults to "".
    #[serde(default)]
    #[x_kube(validation = Rule::new(GROUP_RULE).message(GROUP_MESSAGE))]
    #[garde(custom(crate::field_rules::group_rule))]
    pub group: String,

    /// The kind of the target. Only "Service" is supported.
    #[x_kube(validation = Rule::new(KIND_RULE).message(KIND_MESSAGE))]
    #[garde(custom(crate::field_rules::kind_rule))]
    pub kind: String,

    /// The name of the target Service in the policy's namespace: a DNS-1035 label (1-63 of
    /// lowercase a-z, 0-9 and '-', starting with a letter and ending with a letter or digit).
    #[x_kube(validation = Rule::new(SERVICE_NAME_RULE).message(SERVICE_NAME_MESSAGE))]
    #[garde(custom(crate::field_rules::service_name_rule))]
    pub name: String,
}

/// The observed state of an EndpointPolicy, written by aether-controller.
#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct EndpointPolicyStatus {
    /// The latest observations of the policy's state. Type "Accepted" is True when the policy is
    /// in effect, with reason Accepted, or AcceptedWithoutService when no Service of the target
    /// name exists (policies apply to the pods running as the ServiceAccount of that name, with
    /// or without the Service); when False, its reason says why: Invalid, or Conflicted (another
    /// policy targeting the same Service name wins; the message names it).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    #[schemars(extend("x-kubernetes-list-type" = "map", "x-kubernetes-list-map-keys" = ["type"]))]
    pub conditions: Vec<Condition>,

    /// The metadata.generation of the policy that the conditions were computed from.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub observed_generation: Option<i64>,
}
