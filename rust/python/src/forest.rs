//! `Forest`: an XGBoost booster read once from its JSON and evaluated in Rust.

use std::sync::Arc;

use numpy::{PyReadonlyArray2, PyUntypedArrayMethods};
use pyo3::prelude::*;

use crate::errors::guarded;

/// Gradient-boosted trees trained by the XGBoost package (the booster's JSON, read once).
#[pyclass(frozen, module = "fastsearch._core", name = "Forest")]
pub struct Forest {
    pub trees: Arc<fastsearch_core::Forest>,
}

#[pymethods]
impl Forest {
    #[new]
    #[pyo3(text_signature = "(booster_json)")]
    fn new(py: Python<'_>, booster_json: String) -> PyResult<Self> {
        let trees = guarded(py, "Forest", move || {
            fastsearch_core::Forest::from_json(&booster_json)
        })?;
        Ok(Forest {
            trees: Arc::new(trees),
        })
    }

    /// The margins of the model on feature rows (one per row).
    fn predict(&self, py: Python<'_>, rows: PyReadonlyArray2<'_, f32>) -> PyResult<Vec<f32>> {
        let width = rows.shape()[1];
        let data: Vec<f32> = rows.as_array().iter().copied().collect();
        let trees = Arc::clone(&self.trees);
        guarded(
            py,
            "Forest.predict",
            move || Ok(trees.predict(&data, width)),
        )
    }
}
