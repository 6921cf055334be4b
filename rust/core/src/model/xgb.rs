//! Evaluation of an XGBoost tree ensemble from the booster's JSON model
//! (`Booster.save_raw("json")`).

use serde_json::Value;

use crate::error::{Error, Result};

#[derive(Clone, Debug)]
struct Tree {
    left: Vec<i32>,
    right: Vec<i32>,
    feature: Vec<u32>,
    /// Split threshold of an inner node; the leaf value of a leaf.
    value: Vec<f32>,
    default_left: Vec<bool>,
}

impl Tree {
    fn eval(&self, row: &[f32]) -> f32 {
        let mut node = 0usize;
        loop {
            let left = self.left[node];
            if left < 0 {
                return self.value[node];
            }
            let x = row
                .get(self.feature[node] as usize)
                .copied()
                .unwrap_or(f32::NAN);
            let go_left = if x.is_nan() {
                self.default_left[node]
            } else {
                x < self.value[node]
            };
            node = if go_left {
                left as usize
            } else {
                self.right[node] as usize
            };
        }
    }
}

/// A boosted forest: the prediction (margin) is `base_score + sum of leaves`.
#[derive(Clone, Debug)]
pub struct Forest {
    trees: Vec<Tree>,
    base_score: f32,
    /// Length of the feature rows the forest was trained on.
    pub num_features: usize,
}

fn bad(msg: impl Into<String>) -> Error {
    Error::Malformed(format!("XGBoost model JSON: {}", msg.into()))
}

fn parse_number(v: &Value) -> Option<f64> {
    match v {
        Value::Number(n) => n.as_f64(),
        // XGBoost writes scalars in its learner parameters as strings, sometimes as "[x]".
        Value::String(s) => s.trim_matches(|c| c == '[' || c == ']').parse().ok(),
        Value::Array(a) if a.len() == 1 => parse_number(&a[0]),
        _ => None,
    }
}

fn ints(tree: &Value, key: &str) -> Result<Vec<i64>> {
    tree.get(key)
        .and_then(Value::as_array)
        .ok_or_else(|| bad(format!("tree without `{key}`")))?
        .iter()
        .map(|x| {
            x.as_i64()
                .ok_or_else(|| bad(format!("`{key}` holds a non-integer")))
        })
        .collect()
}

impl Forest {
    /// Reads a booster saved by XGBoost as JSON (`Booster.save_raw("json")`).
    pub fn from_json(text: &str) -> Result<Forest> {
        let v: Value = serde_json::from_str(text).map_err(|e| bad(e.to_string()))?;
        let learner = v.get("learner").ok_or_else(|| bad("no `learner`"))?;
        let params = learner
            .get("learner_model_param")
            .ok_or_else(|| bad("no `learner_model_param`"))?;
        let base_score = params
            .get("base_score")
            .and_then(parse_number)
            .unwrap_or(0.5) as f32;
        let num_features = params
            .get("num_feature")
            .and_then(parse_number)
            .unwrap_or(0.0) as usize;
        let booster = learner
            .get("gradient_booster")
            .ok_or_else(|| bad("no `gradient_booster`"))?;
        let model = booster
            .get("model")
            .ok_or_else(|| bad("only gbtree boosters are supported"))?;
        let trees = model
            .get("trees")
            .and_then(Value::as_array)
            .ok_or_else(|| bad("no `trees`"))?;
        let trees = trees
            .iter()
            .map(|t| {
                let left = ints(t, "left_children")?;
                let right = ints(t, "right_children")?;
                let feature = ints(t, "split_indices")?;
                let default_left = ints(t, "default_left")?;
                let value: Vec<f32> = t
                    .get("split_conditions")
                    .and_then(Value::as_array)
                    .ok_or_else(|| bad("tree without `split_conditions`"))?
                    .iter()
                    .map(|x| {
                        x.as_f64()
                            .map(|f| f as f32)
                            .ok_or_else(|| bad("non-numeric split condition"))
                    })
                    .collect::<Result<_>>()?;
                let n = left.len();
                if [right.len(), feature.len(), default_left.len(), value.len()]
                    .iter()
                    .any(|&m| m != n)
                    || n == 0
                {
                    return Err(bad("tree arrays of different lengths"));
                }
                // Indices are stored as i32: a wider value would change meaning when narrowed
                // (a negative "leaf" marker could become a child index).
                if left
                    .iter()
                    .chain(&right)
                    .any(|&c| i32::try_from(c).is_err())
                {
                    return Err(bad("tree child index out of range"));
                }
                // Children must point forward so evaluation always terminates.
                for i in 0..n {
                    let (l, r) = (left[i], right[i]);
                    if l >= 0
                        && (l as usize <= i
                            || l as usize >= n
                            || r as usize <= i
                            || r as usize >= n)
                    {
                        return Err(bad("tree children out of order"));
                    }
                    if feature[i] < 0 {
                        return Err(bad("negative feature index"));
                    }
                }
                Ok(Tree {
                    left: left.into_iter().map(|x| x as i32).collect(),
                    right: right.into_iter().map(|x| x as i32).collect(),
                    feature: feature.into_iter().map(|x| x as u32).collect(),
                    value,
                    default_left: default_left.into_iter().map(|x| x != 0).collect(),
                })
            })
            .collect::<Result<_>>()?;
        Ok(Forest {
            trees,
            base_score,
            num_features,
        })
    }

    /// The margin of one feature row.
    pub fn predict_row(&self, row: &[f32]) -> f32 {
        self.base_score + self.trees.iter().map(|t| t.eval(row)).sum::<f32>()
    }

    /// Margins of `n` rows stored contiguously, `row_len` values each.
    pub fn predict(&self, rows: &[f32], row_len: usize) -> Vec<f32> {
        if row_len == 0 {
            return Vec::new();
        }
        rows.chunks_exact(row_len)
            .map(|r| self.predict_row(r))
            .collect()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const MODEL: &str = r#"{"learner": {
        "learner_model_param": {"base_score": "[5E-1]", "num_feature": "2"},
        "gradient_booster": {"name": "gbtree", "model": {"trees": [
            {"left_children": [1, -1, -1], "right_children": [2, -1, -1], "split_indices": [0, 0, 0],
             "split_conditions": [1.5, -1.0, 2.0], "default_left": [1, 0, 0]},
            {"left_children": [1, -1, -1], "right_children": [2, -1, -1], "split_indices": [1, 0, 0],
             "split_conditions": [0.0, 0.25, 0.5], "default_left": [0, 0, 0]}
        ]}}}}"#;

    #[test]
    fn evaluates_splits_leaves_and_missing_values() {
        let f = Forest::from_json(MODEL).unwrap();
        assert_eq!(f.num_features, 2);
        assert_eq!(f.predict_row(&[1.0, -1.0]), 0.5 - 1.0 + 0.25);
        assert_eq!(f.predict_row(&[2.0, 1.0]), 0.5 + 2.0 + 0.5);
        // Missing feature 0 goes left in tree 0; missing feature 1 goes right in tree 1.
        assert_eq!(f.predict_row(&[f32::NAN, f32::NAN]), 0.5 - 1.0 + 0.5);
    }

    #[test]
    fn rejects_cycles_and_garbage() {
        assert!(Forest::from_json("{}").is_err());
        let cyclic = MODEL.replace(
            "[1, -1, -1], \"right_children\": [2, -1, -1], \"split_indices\": [0, 0, 0]",
            "[0, -1, -1], \"right_children\": [0, -1, -1], \"split_indices\": [0, 0, 0]",
        );
        assert!(Forest::from_json(&cyclic).is_err());
    }
}
