//! One source, one key: the same module written two ways is one index entry, one lock and one
//! resource, and a cache written before keys were canonical keeps serving.

use serde_json::Value;

use crate::support::*;

fn index(cache: &std::path::Path) -> Value {
    serde_json::from_slice(&std::fs::read(cache.join("index.json")).unwrap()).unwrap()
}

/// A server holding one module, an empty cache, and two spellings of the module's URL.
struct Spellings {
    server: Server,
    _dir: tempfile::TempDir,
    cache: std::path::PathBuf,
    plain: String,
    shouted: String,
}

fn spellings(tag: &str) -> Spellings {
    let server = Server::start(vec![("/m.wasm", Behaviour::Ok(module(tag)))]);
    let dir = tempfile::tempdir().unwrap();
    let cache = dir.path().join("cache");
    let plain = server.url("/m.wasm");
    let shouted = plain.replace("http://", "HTTP://");
    assert_ne!(plain, shouted);
    Spellings {
        server,
        _dir: dir,
        cache,
        plain,
        shouted,
    }
}

/// `pull --json --pull-policy Always --resource-version <version>`.
fn always(cache: &std::path::Path, url: &str, version: &str) -> Value {
    json(&pull(
        cache,
        &[
            url,
            "--json",
            "--pull-policy",
            "Always",
            "--resource-version",
            version,
        ],
    ))
}

fn json(o: &std::process::Output) -> Value {
    assert_eq!(o.status.code(), Some(0), "{}", stderr(o));
    serde_json::from_slice(&o.stdout).unwrap()
}

#[test]
fn two_spellings_of_one_source_are_one_entry_one_lock_and_one_resource() {
    let Spellings {
        server,
        cache,
        plain,
        shouted,
        ..
    } = spellings("key");

    let first = always(&cache, &plain, "1");
    // The other spelling is the same source (Never: not fetched) and the same resource
    // (Always with the version already pulled: not fetched).
    let again = json(&pull(
        &cache,
        &[&shouted, "--json", "--pull-policy", "Never"],
    ));
    assert_eq!(again["sha256"], first["sha256"]);
    assert_eq!(
        again["source"],
        plain.as_str(),
        "reported by its canonical key"
    );
    let same_version = always(&cache, &shouted, "1");
    assert_eq!(same_version["from_cache"], true);
    assert_eq!(server.hits("/m.wasm"), 1);

    // Always without a version checks the source again, under the same lock.
    let checked = json(&pull(
        &cache,
        &[&shouted, "--json", "--pull-policy", "Always"],
    ));
    assert_eq!(checked["from_cache"], false);
    assert_eq!(server.hits("/m.wasm"), 2);
    assert_eq!(lock_files(&cache).len(), 1, "{:?}", lock_files(&cache));

    let idx = index(&cache);
    let sources: Vec<&String> = idx["sources"].as_object().unwrap().keys().collect();
    assert_eq!(sources, [&plain]);
    let resources: Vec<&String> = idx["resources"].as_object().unwrap().keys().collect();
    assert_eq!(resources, [&plain]);
}

#[test]
fn an_index_written_before_canonical_keys_keeps_serving_and_is_migrated() {
    let Spellings {
        server,
        cache,
        plain,
        shouted,
        ..
    } = spellings("old");
    let pulled = always(&cache, &shouted, "7");
    // What an older fetcher wrote: no format, the URL exactly as given as source, resource
    // and module source.
    let mut idx = index(&cache);
    let obj = idx.as_object_mut().unwrap();
    assert_eq!(obj.remove("format"), Some(2.into()));
    for map in ["sources", "resources"] {
        let entries = obj[map].as_object_mut().unwrap();
        let entry = entries.remove(&plain).unwrap();
        entries.insert(shouted.clone(), entry);
    }
    let sha = pulled["sha256"].as_str().unwrap();
    obj["modules"][sha]["source"] = shouted.clone().into();
    std::fs::write(cache.join("index.json"), serde_json::to_vec(&idx).unwrap()).unwrap();

    for spelling in [&plain, &shouted] {
        let hit = json(&pull(
            &cache,
            &[spelling, "--json", "--pull-policy", "Never"],
        ));
        assert_eq!(hit["sha256"], sha, "{spelling}");
        let same_version = always(&cache, spelling, "7");
        assert_eq!(same_version["from_cache"], true, "{spelling}");
    }
    assert_eq!(
        server.hits("/m.wasm"),
        1,
        "the older cache answered every pull"
    );

    // The next write stores the migrated form.
    let o = pull(&cache, &[&plain, "--pull-policy", "Always"]);
    assert_eq!(o.status.code(), Some(0), "{}", stderr(&o));
    let idx = index(&cache);
    assert_eq!(idx["format"], 2);
    let sources: Vec<&String> = idx["sources"].as_object().unwrap().keys().collect();
    assert_eq!(sources, [&plain]);
    assert_eq!(idx["resources"][&plain], "7");
    assert_eq!(idx["modules"][sha]["source"], plain.as_str());
    let ls = fetcher()
        .args(["ls", "--json", "--cache-dir"])
        .arg(&cache)
        .output()
        .unwrap();
    let listed: Value = serde_json::from_slice(&ls.stdout).unwrap();
    assert_eq!(listed[0]["source"], plain.as_str());
}
