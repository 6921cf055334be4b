//! Cost models that score candidates inside the search, in Rust.
//!
//! * [`xgb`] — gradient-boosted trees trained by the XGBoost Python package, evaluated here from
//!   the booster's JSON so scoring thousands of candidates costs microseconds each.

pub mod xgb;

pub use xgb::Forest;
