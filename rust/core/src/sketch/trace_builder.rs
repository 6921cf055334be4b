//! Emits instructions in MetaSchedule's trace JSON, naming random variables as TVM does
//! (`b` blocks, `l` loops, `v` sampled integers).

use serde_json::{json, Value};

#[derive(Default, Debug, Clone)]
pub struct TraceBuilder {
    insts: Vec<Value>,
    decisions: Vec<Value>,
    next: usize,
}

impl TraceBuilder {
    pub fn new() -> Self {
        Self::default()
    }

    fn fresh(&mut self, prefix: char, n: usize) -> Vec<String> {
        (0..n)
            .map(|_| {
                let name = format!("{prefix}{}", self.next);
                self.next += 1;
                name
            })
            .collect()
    }

    fn push(&mut self, kind: &str, inputs: Vec<Value>, attrs: Vec<Value>, outputs: &[String]) {
        self.insts.push(json!([kind, inputs, attrs, outputs]));
    }

    fn decide(&mut self, decision: Value) {
        self.decisions.push(json!([self.insts.len() - 1, decision]));
    }

    pub fn get_block(&mut self, name: &str, func: &str) -> String {
        let out = self.fresh('b', 1);
        self.push("GetSBlock", vec![], vec![json!(name), json!(func)], &out);
        out[0].clone()
    }

    pub fn get_loops(&mut self, block: &str, n: usize) -> Vec<String> {
        let out = self.fresh('l', n);
        self.push("GetLoops", vec![json!(block)], vec![], &out);
        out
    }

    pub fn compute_inline(&mut self, block: &str) {
        self.push("ComputeInline", vec![json!(block)], vec![], &[]);
    }

    /// `SamplePerfectTile` with its decision, then `Split` by the sampled factors.
    pub fn sample_and_split(
        &mut self,
        lp: &str,
        factors: &[i64],
        max_innermost: i64,
    ) -> Vec<String> {
        let vars = self.fresh('v', factors.len());
        self.push(
            "SamplePerfectTile",
            vec![json!(lp)],
            vec![json!(factors.len()), json!(max_innermost)],
            &vars,
        );
        self.decide(json!(factors));
        let loops = self.fresh('l', factors.len());
        let mut inputs = vec![json!(lp)];
        inputs.extend(vars.iter().map(|v| json!(v)));
        self.push("Split", inputs, vec![json!(true), json!(false)], &loops);
        loops
    }

    pub fn reorder(&mut self, loops: &[String]) {
        self.push(
            "Reorder",
            loops.iter().map(|l| json!(l)).collect(),
            vec![],
            &[],
        );
    }

    pub fn fuse(&mut self, loops: &[String]) -> String {
        let out = self.fresh('l', 1);
        self.push(
            "Fuse",
            loops.iter().map(|l| json!(l)).collect(),
            vec![json!(1)],
            &out,
        );
        out[0].clone()
    }

    pub fn cache_write(&mut self, block: &str, index: usize, scope: &str) -> String {
        let out = self.fresh('b', 1);
        self.push(
            "CacheWrite",
            vec![json!(block), json!([])],
            vec![json!(index), json!(scope)],
            &out,
        );
        out[0].clone()
    }

    pub fn compute_at(&mut self, block: &str, lp: &str) {
        self.push(
            "ComputeAt",
            vec![json!(block), json!(lp)],
            vec![json!(1), json!(-1)],
            &[],
        );
    }

    pub fn reverse_compute_at(&mut self, block: &str, lp: &str) {
        self.push(
            "ReverseComputeAt",
            vec![json!(block), json!(lp)],
            vec![json!(1), json!(-1)],
            &[],
        );
    }

    pub fn rfactor(&mut self, lp: &str, factor_axis: usize) -> String {
        let out = self.fresh('b', 1);
        self.push("RFactor", vec![json!(lp)], vec![json!(factor_axis)], &out);
        out[0].clone()
    }

    /// Annotates with an integer literal.
    pub fn annotate_int(&mut self, target: &str, key: &str, value: i64) {
        self.push(
            "Annotate",
            vec![json!(target), json!(value)],
            vec![json!(key)],
            &[],
        );
    }

    /// Annotates with a string literal (TVM quotes string literals in trace inputs).
    pub fn annotate_str(&mut self, target: &str, key: &str, value: &str) {
        self.push(
            "Annotate",
            vec![json!(target), json!(format!("\"{value}\""))],
            vec![json!(key)],
            &[],
        );
    }

    /// `SampleCategorical` over `candidates` (uniform), decided as `choice`, then annotates with it.
    pub fn annotate_categorical(
        &mut self,
        target: &str,
        key: &str,
        candidates: &[i64],
        choice: usize,
    ) {
        let var = self.sample_categorical(candidates, choice);
        self.annotate_var(target, key, &var);
    }

    /// `Bind` of a loop to a thread axis (`blockIdx.x`, `vthread.x`, `threadIdx.x`).
    pub fn bind(&mut self, lp: &str, axis: &str) {
        self.push("Bind", vec![json!(lp)], vec![json!(axis)], &[]);
    }

    /// `Split` of `lp` into an outer loop of inferred extent and an inner one of `factor`
    /// (a sampled variable), as AutoBind and cross-thread reduction split.
    pub fn split_inner(&mut self, lp: &str, factor: &str) -> [String; 2] {
        let loops = self.fresh('l', 2);
        self.push(
            "Split",
            vec![json!(lp), json!("None"), json!(factor)],
            vec![json!(true), json!(false)],
            &loops,
        );
        [loops[0].clone(), loops[1].clone()]
    }

    /// `SampleCategorical` over `candidates` (uniform), decided as `choice`: the variable.
    pub fn sample_categorical(&mut self, candidates: &[i64], choice: usize) -> String {
        let out = self.fresh('v', 1);
        let p = 1.0 / candidates.len() as f64;
        let probs: Vec<f64> = candidates.iter().map(|_| p).collect();
        self.push(
            "SampleCategorical",
            vec![],
            vec![json!(candidates), json!(probs)],
            &out,
        );
        self.decide(json!(choice));
        out[0].clone()
    }

    /// Annotates with a sampled variable.
    pub fn annotate_var(&mut self, target: &str, key: &str, var: &str) {
        self.push(
            "Annotate",
            vec![json!(target), json!(var)],
            vec![json!(key)],
            &[],
        );
    }

    /// `CacheRead` of read `index` of `block` into `scope`, read by `block` alone.
    pub fn cache_read(&mut self, block: &str, index: usize, scope: &str) -> String {
        let out = self.fresh('b', 1);
        self.push(
            "CacheRead",
            vec![json!(block), json!([block])],
            vec![json!(index), json!(scope)],
            &out,
        );
        out[0].clone()
    }

    /// `SetScope` of write buffer `index` of `block`.
    pub fn set_scope(&mut self, block: &str, index: usize, scope: &str) {
        self.push(
            "SetScope",
            vec![json!(block)],
            vec![json!(index), json!(scope)],
            &[],
        );
    }

    pub fn reverse_compute_inline(&mut self, block: &str) {
        self.push("ReverseComputeInline", vec![json!(block)], vec![], &[]);
    }

    pub fn finish(self) -> Value {
        json!([self.insts, self.decisions])
    }
}
