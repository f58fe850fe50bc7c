//! A header map and its edits the way Envoy's `HeaderMap` does them: lower-case keys,
//! pseudo-headers first, `setCopy` semantics for a replace. One home for these rules, used by
//! the hostcalls, the emulated connection manager and router, and the HTTP/1 reader.

/// A header map as Envoy keeps it: lower-case keys, insertion order, duplicates allowed.
pub type HeaderMap = Vec<(String, Vec<u8>)>;

/// Envoy keeps pseudo-headers ahead of regular ones; a new pseudo-header goes after the last.
/// An owned key is lower-cased in place, so a key read from the guest costs no second copy.
pub fn add(map: &mut HeaderMap, key: impl Into<String>, value: Vec<u8>) {
    let mut key = key.into();
    key.make_ascii_lowercase();
    if key.starts_with(':') {
        let at = map.iter().take_while(|(k, _)| k.starts_with(':')).count();
        map.insert(at, (key, value));
    } else {
        map.push((key, value));
    }
}

/// Envoy's `setCopy` (current runtime default): drop every value of the key, then add it.
pub fn replace(map: &mut HeaderMap, key: impl Into<String>, value: Vec<u8>) {
    let key = key.into();
    remove(map, &key);
    add(map, key, value);
}

/// Keys are stored lower-case (see `add`), so lookups compare without allocating.
pub fn remove(map: &mut HeaderMap, key: &str) {
    map.retain(|(k, _)| !k.eq_ignore_ascii_case(key));
}

/// The first value of a key, as Envoy's `getHeaderMapValue` returns.
pub fn get<'a>(map: &'a HeaderMap, key: &str) -> Option<&'a [u8]> {
    map.iter()
        .find(|(k, _)| k.eq_ignore_ascii_case(key))
        .map(|(_, v)| v.as_slice())
}
