//! JSON merge patch (RFC 7386): objects merge key by key, `null` removes, anything else
//! replaces. Kept here rather than taken from the `json-patch` crate: the whole algorithm is
//! the one short function below, and the crate would add JSON Pointer and RFC 6902 patches
//! (and their dependencies) that berth does not serve.

use serde_json::Value;

pub fn merge(target: &mut Value, patch: &Value) {
    let Value::Object(patch) = patch else {
        *target = patch.clone();
        return;
    };
    if !target.is_object() {
        *target = Value::Object(serde_json::Map::new());
    }
    if let Value::Object(target) = target {
        for (key, value) in patch {
            if value.is_null() {
                target.remove(key);
            } else {
                merge(target.entry(key.clone()).or_insert(Value::Null), value);
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use serde_json::json;

    use super::*;

    #[test]
    fn rfc_7386_examples() {
        let table = [
            (json!({"a": "b"}), json!({"a": "c"}), json!({"a": "c"})),
            (
                json!({"a": "b"}),
                json!({"b": "c"}),
                json!({"a": "b", "b": "c"}),
            ),
            (json!({"a": "b"}), json!({"a": null}), json!({})),
            (
                json!({"a": "b", "b": "c"}),
                json!({"a": null}),
                json!({"b": "c"}),
            ),
            (json!({"a": ["b"]}), json!({"a": "c"}), json!({"a": "c"})),
            (
                json!({"a": {"b": "c"}}),
                json!({"a": {"b": "d", "c": null}}),
                json!({"a": {"b": "d"}}),
            ),
            (
                json!({"a": [{"b": "c"}]}),
                json!({"a": [1]}),
                json!({"a": [1]}),
            ),
            (json!(["a", "b"]), json!(["c", "d"]), json!(["c", "d"])),
            (json!({"a": "foo"}), json!(null), json!(null)),
            (
                json!({"e": null}),
                json!({"a": 1}),
                json!({"e": null, "a": 1}),
            ),
            (
                json!([1, 2]),
                json!({"a": "b", "c": null}),
                json!({"a": "b"}),
            ),
        ];
        for (mut target, patch, expected) in table {
            merge(&mut target, &patch);
            assert_eq!(target, expected, "{patch}");
        }
    }

    mod properties {
        use proptest::prelude::*;
        use serde_json::{Map, Value};

        use super::merge;

        /// JSON from a small key alphabet, so patches and targets share keys; `null` anywhere.
        fn json() -> impl Strategy<Value = Value> {
            let leaf = prop_oneof![
                Just(Value::Null),
                any::<bool>().prop_map(Value::Bool),
                (-3i64..3).prop_map(Value::from),
                "[a-c]{0,2}".prop_map(Value::String),
            ];
            leaf.prop_recursive(3, 24, 4, |inner| {
                prop_oneof![
                    proptest::collection::vec(inner.clone(), 0..3).prop_map(Value::Array),
                    proptest::collection::btree_map("[a-d]", inner, 0..4)
                        .prop_map(|m| Value::Object(m.into_iter().collect())),
                ]
            })
        }

        /// `value` with every object member that is `null` removed: what a merge patch can
        /// produce (it cannot set a member to null).
        fn without_null_members(value: &Value) -> Value {
            match value {
                Value::Object(map) => Value::Object(
                    map.iter()
                        .filter(|(_, v)| !v.is_null())
                        .map(|(k, v)| (k.clone(), without_null_members(v)))
                        .collect(),
                ),
                other => other.clone(),
            }
        }

        /// RFC 7386's reading of "the patch that turns `source` into `target`".
        fn diff(source: &Value, target: &Value) -> Value {
            match (source, target) {
                (Value::Object(s), Value::Object(t)) => {
                    let mut patch = Map::new();
                    for key in s.keys().filter(|k| !t.contains_key(*k)) {
                        patch.insert(key.clone(), Value::Null);
                    }
                    for (key, value) in t {
                        match s.get(key) {
                            Some(old) if old == value => {}
                            Some(old) => {
                                patch.insert(key.clone(), diff(old, value));
                            }
                            None => {
                                patch.insert(key.clone(), value.clone());
                            }
                        }
                    }
                    Value::Object(patch)
                }
                _ => target.clone(),
            }
        }

        proptest! {
            #![proptest_config(crate::testing::proptest_config())]

            /// Patching with the diff yields the target.
            #[test]
            fn the_diff_patches_the_source_into_the_target(source in json(), target in json()) {
                let target = without_null_members(&target);
                let mut patched = source.clone();
                merge(&mut patched, &diff(&source, &target));
                prop_assert_eq!(patched, target);
            }

            /// Applying a patch twice is applying it once.
            #[test]
            fn a_patch_is_idempotent(target in json(), patch in json()) {
                let mut once = target;
                merge(&mut once, &patch);
                let mut twice = once.clone();
                merge(&mut twice, &patch);
                prop_assert_eq!(twice, once);
            }

            /// A member patched to null is gone; one the patch does not name is untouched; an
            /// empty patch changes no object.
            #[test]
            fn null_deletes_and_the_rest_stays(target in json(), patch in json()) {
                let mut patched = target.clone();
                merge(&mut patched, &patch);
                if let Value::Object(members) = &patch {
                    let Value::Object(result) = &patched else {
                        return Err(TestCaseError::fail("an object patch made a non-object"));
                    };
                    for (key, value) in members {
                        prop_assert_eq!(result.contains_key(key), !value.is_null(), "{}", key);
                    }
                    if let Value::Object(before) = &target {
                        for (key, value) in before.iter().filter(|(k, _)| !members.contains_key(*k)) {
                            prop_assert_eq!(result.get(key), Some(value));
                        }
                        let mut same = target.clone();
                        merge(&mut same, &Value::Object(Map::new()));
                        prop_assert_eq!(same, target.clone());
                    }
                } else {
                    prop_assert_eq!(patched, patch);
                }
            }
        }
    }
}
