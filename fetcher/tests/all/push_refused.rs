//! `push` against a loopback registry that refuses or misbehaves: what the error says to do,
//! and what is not sent.

use crate::push::push;
use crate::support::*;

/// A registry on loopback that takes the ping and answers the push with `routes`.
fn scripted_registry(routes: Vec<(&str, Behaviour)>) -> Server {
    let mut all = vec![("/v2/", Behaviour::Ok(b"{}".to_vec()))];
    all.extend(routes);
    Server::start(all)
}

fn json_error(status: u16, code: &str, message: &str) -> Behaviour {
    Behaviour::Respond(
        status,
        vec![("content-type".into(), "application/json".into())],
        format!(r#"{{"errors":[{{"code":"{code}","message":"{message}"}}]}}"#).into_bytes(),
    )
}

#[test]
fn a_refused_push_says_what_to_do() {
    let dir = tempfile::tempdir().unwrap();
    let m = dir.path().join("m.wasm");
    std::fs::write(&m, module("refused")).unwrap();
    let m = m.to_str().unwrap();
    let opened = || {
        Behaviour::Respond(
            202,
            vec![("location".into(), "/upload/1".into())],
            Vec::new(),
        )
    };

    // Credentials without write access: the registry answers the upload with 403.
    let denied = scripted_registry(vec![(
        "/v2/r/filter/blobs/uploads/",
        json_error(403, "DENIED", "requested access to the resource is denied"),
    )]);
    let url = format!("oci://{}/r/filter:1", denied.host());
    let o = push(dir.path(), &[m, &url]);
    let err = stderr(&o);
    assert_eq!(o.status.code(), Some(1), "{err}");
    assert!(
        err.starts_with(&format!(
            "wasm-fetcher: {url}: denied: registry {}",
            denied.host()
        )),
        "{err}"
    );
    assert!(
        err.contains("push (write) access") && err.contains("--pull-secret"),
        "{err}"
    );

    // A registry that does not take the artifact's media types.
    for refusal in [
        json_error(400, "MANIFEST_INVALID", "manifest invalid"),
        Behaviour::Status(415),
    ] {
        let picky = scripted_registry(vec![
            ("/v2/r/filter/blobs/uploads/", opened()),
            ("/upload/1", Behaviour::Respond(201, vec![], Vec::new())),
            ("/v2/r/filter/manifests/1", refusal),
        ]);
        let url = format!("oci://{}/r/filter:1", picky.host());
        let o = push(dir.path(), &[m, &url]);
        let err = stderr(&o);
        assert_eq!(o.status.code(), Some(1), "{err}");
        assert!(err.contains("refused media type"), "{err}");
        assert!(err.contains("--layout compat"), "{err}");
        let put = picky
            .seen()
            .into_iter()
            .find(|s| s.target == "/v2/r/filter/manifests/1" && s.header("content-type").is_some())
            .expect("the manifest was offered");
        assert_eq!(
            put.header("content-type"),
            Some("application/vnd.oci.image.manifest.v1+json")
        );
    }

    // An upload location the address guard refuses: nothing is sent there.
    let steering = scripted_registry(vec![(
        "/v2/r/filter/blobs/uploads/",
        Behaviour::Respond(
            202,
            vec![("location".into(), "http://169.254.169.254/upload".into())],
            Vec::new(),
        ),
    )]);
    let url = format!("oci://{}/r/filter:1", steering.host());
    let o = push(dir.path(), &[m, &url]);
    let err = stderr(&o);
    assert_eq!(o.status.code(), Some(1), "{err}");
    assert!(err.contains("blocked address"), "{err}");
}

/// One rule for a redirect on any upload request (the POST that opens an upload, a blob's
/// PUT, the manifest's PUT): refused with the same words, whether or not the body could be
/// sent again, and nothing follows it.
#[test]
fn a_redirect_on_any_upload_request_is_refused_in_the_same_words() {
    let dir = tempfile::tempdir().unwrap();
    let m = dir.path().join("m.wasm");
    std::fs::write(&m, module("redirected")).unwrap();
    let m = m.to_str().unwrap();
    let elsewhere = Server::start_on("127.0.0.2", vec![]);
    let away = |status: u16| {
        Behaviour::Respond(
            status,
            vec![("location".into(), elsewhere.url("/upload?_state=secret"))],
            Vec::new(),
        )
    };
    // The route answers every method: the GET asking whether the tag exists may follow its
    // redirect (a read), an upload may not (it carries a length or a type).
    let uploads_elsewhere = || {
        elsewhere
            .seen()
            .iter()
            .filter(|s| s.header("content-length").is_some() || s.header("content-type").is_some())
            .count()
    };
    let opened = || {
        Behaviour::Respond(
            202,
            vec![("location".into(), "/upload/1".into())],
            Vec::new(),
        )
    };
    let cases = [
        (
            vec![("/v2/r/filter/blobs/uploads/", away(307))],
            "the upload's opening POST with HTTP 307",
        ),
        (
            vec![
                ("/v2/r/filter/blobs/uploads/", opened()),
                ("/upload/1", away(308)),
            ],
            "a blob's PUT with HTTP 308",
        ),
        (
            vec![
                ("/v2/r/filter/blobs/uploads/", opened()),
                ("/upload/1", Behaviour::Respond(201, vec![], Vec::new())),
                ("/v2/r/filter/manifests/1", away(307)),
            ],
            "the manifest's PUT with HTTP 307",
        ),
    ];
    for (routes, words) in cases {
        let reg = scripted_registry(routes);
        let url = format!("oci://{}/r/filter:1", reg.host());
        let o = push(dir.path(), &[m, &url]);
        let err = stderr(&o);
        assert_eq!(o.status.code(), Some(1), "{err}");
        assert!(
            err.contains(&format!(
                "redirected upload: registry {} answered {words} to {}; push follows no redirect on an upload",
                reg.host(),
                elsewhere.url("/upload")
            )),
            "{err}"
        );
        assert!(
            !err.contains("secret"),
            "the upload's state was printed: {err}"
        );
        assert_eq!(uploads_elsewhere(), 0, "{words}: an upload followed");
    }
}
