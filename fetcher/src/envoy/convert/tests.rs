//! convert's unit tests: sites read from every shape and spelling, outcomes applied in place,
//! malformed input refused by field.

use super::*;
use crate::envoy::fallback::FilterType;

fn doc(yaml: &str) -> Value {
    serde_norway::from_str(yaml).unwrap()
}

const ECDS: &str = r#"
resources:
- "@type": type.googleapis.com/envoy.config.core.v3.TypedExtensionConfig
  name: extensions.istio.io/wasmplugin/ns.a
  typed_config:
    "@type": type.googleapis.com/envoy.extensions.filters.http.wasm.v3.Wasm
    config:
      name: ns.a
      fail_open: true
      vm_config:
        runtime: envoy.wasm.runtime.v8
        environment_variables:
          key_values:
            ISTIO_META_WASM_IMAGE_PULL_POLICY: Always
            ISTIO_META_WASM_PLUGIN_RESOURCE_VERSION: "42"
            ISTIO_META_WASM_IMAGE_PULL_SECRET: '{"auths":{}}'
        code:
          remote:
            http_uri: {uri: "oci://127.0.0.1:5000/f:1", timeout: 30s, cluster: _}
            sha256: nil
- "@type": type.googleapis.com/envoy.config.core.v3.TypedExtensionConfig
  name: b
  typed_config:
    "@type": type.googleapis.com/udpa.type.v1.TypedStruct
    type_url: type.googleapis.com/envoy.extensions.filters.network.wasm.v3.Wasm
    value:
      config:
        failure_policy: FAIL_CLOSED
        vm_config: {code: {remote: {http_uri: {uri: "https://h.example/b.wasm"}}}}
"#;

#[test]
fn sites_carry_istios_settings() {
    let d = doc(ECDS);
    let s = sites(&d).unwrap();
    assert_eq!(s.len(), 2);
    assert_eq!(s[0].at, "resources[0].typed_config");
    assert_eq!(s[0].kind, Kind::Filter(FilterType::Http));
    assert!(s[0].fail_open);
    assert_eq!(s[0].request.policy, Some(PullPolicy::Always));
    assert_eq!(s[0].request.resource_version.as_deref(), Some("42"));
    assert_eq!(
        s[0].request.resource.as_deref(),
        Some("extensions.istio.io/wasmplugin/ns.a")
    );
    assert_eq!(s[0].request.sha256, None);
    assert_eq!(s[0].timeout, Some(Duration::from_secs(30)));
    assert_eq!(s[0].secret.as_deref(), Some(&br#"{"auths":{}}"#[..]));
    // The agent's variables are gone, and with them the whole environment.
    assert!(s[0].message["config"]["vm_config"]
        .get("environment_variables")
        .is_none());
    assert_eq!(s[1].kind, Kind::Filter(FilterType::Network));
    assert!(!s[1].fail_open, "FAIL_CLOSED");
}

#[test]
fn outcomes_replace_the_any_in_place() {
    let mut d = doc(ECDS);
    let s = sites(&d).unwrap();
    let pulled = crate::Pulled {
        path: "/c/m.wasm".into(),
        source: String::new(),
        sha256: crate::Sha256::parse(&"ab".repeat(32)).unwrap(),
        manifest_digest: None,
        pin: None,
        from_cache: false,
        signature: None,
    };
    apply(&mut d, &s[0], Ok(&pulled)).unwrap();
    let e = FetchError::HttpStatus {
        status: 404,
        reason: String::new(),
    };
    let c = apply(&mut d, &s[1], Err(&e)).unwrap();
    assert!(matches!(
        c.outcome,
        Outcome::Fallback {
            fallback: Fallback::DenyAll,
            ..
        }
    ));
    let a = &d["resources"][0]["typed_config"];
    assert_eq!(a["@type"], url::HTTP_WASM);
    assert_eq!(
        a["config"]["vm_config"]["code"],
        json!({"local": {"filename": "/c/m.wasm"}})
    );
    assert_eq!(a["config"]["vm_config"]["runtime"], "envoy.wasm.runtime.v8");
    assert_eq!(
        d["resources"][1]["typed_config"],
        Fallback::DenyAll.config(FilterType::Network)
    );
    assert_eq!(d["resources"][1]["name"], "b");
}

/// Envoy reads proto JSON's names as well as snake_case ones; so does convert, and the
/// module is written where the input spelled it.
#[test]
fn proto_json_names_are_read_as_envoy_reads_them() {
    let camel = ECDS
        .replace("vm_config", "vmConfig")
        .replace("http_uri", "httpUri")
        .replace("environment_variables", "environmentVariables")
        .replace("key_values", "keyValues")
        .replace("type_url", "typeUrl")
        .replace("typed_config", "typedConfig")
        .replace("fail_open: true", "failOpen: true")
        .replace("failure_policy: FAIL_CLOSED", "failurePolicy: FAIL_OPEN");
    let mut d = doc(&camel);
    let s = sites(&d).unwrap();
    assert_eq!(s.len(), 2);
    assert_eq!(s[0].at, "resources[0].typedConfig");
    assert!(s[0].fail_open, "failOpen: true");
    assert_eq!(s[0].request.policy, Some(PullPolicy::Always));
    assert_eq!(s[0].request.resource_version.as_deref(), Some("42"));
    assert_eq!(
        s[0].request.resource.as_deref(),
        Some("extensions.istio.io/wasmplugin/ns.a")
    );
    assert_eq!(s[0].timeout, Some(Duration::from_secs(30)));
    assert!(s[0].message["config"]["vmConfig"]
        .get("environmentVariables")
        .is_none());
    assert_eq!(s[1].kind, Kind::Filter(FilterType::Network));
    assert!(s[1].fail_open, "failurePolicy: FAIL_OPEN");
    let pulled = crate::Pulled {
        path: "/c/m.wasm".into(),
        source: String::new(),
        sha256: crate::Sha256::parse(&"ab".repeat(32)).unwrap(),
        manifest_digest: None,
        pin: None,
        from_cache: false,
        signature: None,
    };
    apply(&mut d, &s[0], Ok(&pulled)).unwrap();
    let config = &d["resources"][0]["typedConfig"]["config"];
    assert_eq!(
        config["vmConfig"]["code"],
        json!({"local": {"filename": "/c/m.wasm"}})
    );
    assert!(config.get("vm_config").is_none(), "{config}");
}

/// Both policies set is what Envoy refuses ("only one of fail_open or failure_policy can
/// be set"), in any spelling; one field in both spellings is refused too (Envoy keeps the
/// last, which a JSON object cannot tell).
#[test]
fn what_envoy_refuses_is_refused_in_either_spelling() {
    for (policy, open) in [
        ("failure_policy", "fail_open"),
        ("failurePolicy", "fail_open"),
        ("failure_policy", "failOpen"),
        ("failurePolicy", "failOpen"),
    ] {
        let text = ECDS.replace(
            "failure_policy: FAIL_CLOSED\n",
            &format!("{policy}: FAIL_CLOSED\n        {open}: true\n"),
        );
        match sites(&doc(&text)) {
            Err(ConvertError::Invalid { field, message }) => {
                assert_eq!(
                    field,
                    format!("resources[1].typed_config.value.config.{open}")
                );
                assert!(
                    message.contains("only one of fail_open or failure_policy"),
                    "{message}"
                );
            }
            other => panic!("{policy} + {open}: {other:?}"),
        }
    }
    // UNSPECIFIED is no policy: fail_open decides, as in Envoy.
    let unspecified = ECDS.replace(
        "failure_policy: FAIL_CLOSED\n",
        "failurePolicy: UNSPECIFIED\n        fail_open: true\n",
    );
    assert!(sites(&doc(&unspecified)).unwrap()[1].fail_open);
    for (twice, field) in [
        (
            (
                "failure_policy: FAIL_CLOSED\n",
                "failure_policy: FAIL_CLOSED\n        failurePolicy: FAIL_OPEN\n",
            ),
            "resources[1].typed_config.value.config.failure_policy",
        ),
        (
            (
                "fail_open: true\n      vm_config",
                "fail_open: true\n      failOpen: false\n      vm_config",
            ),
            "resources[0].typed_config.config.fail_open",
        ),
        (
            ("vm_config: {code", "vmConfig: {}\n        vm_config: {code"),
            "resources[1].typed_config.value.config.vm_config",
        ),
    ] {
        assert!(ECDS.contains(twice.0), "{}", twice.0);
        match sites(&doc(&ECDS.replace(twice.0, twice.1))) {
            Err(ConvertError::Invalid { field: f, message }) => {
                assert_eq!(f, field);
                assert!(message.starts_with("set twice"), "{message}");
            }
            other => panic!("{}: {other:?}", twice.1),
        }
    }
}

#[test]
fn malformed_input_names_the_field() {
    for (from, to, field) in [
        (
            "uri: \"oci://127.0.0.1:5000/f:1\"",
            "uri: \"ftp://h/x\"",
            "resources[0].typed_config.config.vm_config.code.remote.http_uri.uri",
        ),
        (
            "sha256: nil",
            "sha256: abc",
            "resources[0].typed_config.config.vm_config.code.remote.sha256",
        ),
        (
            "timeout: 30s",
            "timeout: soon",
            "resources[0].typed_config.config.vm_config.code.remote.http_uri.timeout",
        ),
        (
            "failure_policy: FAIL_CLOSED",
            "failure_policy: CLOSED",
            "resources[1].typed_config.value.config.failure_policy",
        ),
        (
            "{code: {remote: {http_uri: {uri: \"https://h.example/b.wasm\"}}}}",
            "{code: {remote: {sha256: x}}}",
            "resources[1].typed_config.value.config.vm_config.code.remote.http_uri",
        ),
        (
            "{code: {remote: {http_uri: {uri: \"https://h.example/b.wasm\"}}}}",
            "{runtime: v8}",
            "resources[1].typed_config.value.config.vm_config.code",
        ),
    ] {
        assert!(ECDS.contains(from), "{from}");
        match sites(&doc(&ECDS.replace(from, to))) {
            Err(ConvertError::Invalid { field: f, .. }) => assert_eq!(f, field, "{to}"),
            other => panic!("{to}: {other:?}"),
        }
    }
    assert!(sites(&json!({"static_resources": {}})).unwrap().is_empty());
    let local = json!({"@type": url::HTTP_WASM, "config": {"vm_config": {"code": {"local": {"filename": "/m.wasm"}}}}});
    assert!(sites(&local).unwrap().is_empty());
}
