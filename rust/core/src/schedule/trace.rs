//! MetaSchedule traces in their JSON form (`[insts, decisions]`) and their replay.
//!
//! Each instruction is `[kind, inputs, attrs, outputs]`. Inputs name earlier outputs (`b0`,
//! `l2`, `v6`) or are literals: JSON numbers, `null`, nested arrays, and strings quoted inside
//! the string (`"\"SSRSRS\""`). Decisions are `[[instruction index, decision], ...]`.

use std::collections::HashMap;

use serde_json::{json, Value};

use super::state::{BlockId, Child, LoopId, State};
use super::{cache, compute, gpu_postproc, loops, postproc, reduction};
use crate::error::{Error, Result};
use crate::gpu_target::GpuTarget;
use crate::program::LoopKind;
use crate::rng::Rng;

/// One instruction of a trace.
#[derive(Clone, Debug, PartialEq)]
pub struct Instruction {
    /// The instruction's kind, as MetaSchedule names it (`Split`, `ComputeAt`, ...).
    pub kind: String,
    /// Random variables of earlier instructions (by name) and literals.
    pub inputs: Vec<Value>,
    /// The instruction's attributes, in MetaSchedule's order.
    pub attrs: Vec<Value>,
    /// Names of the random variables it defines.
    pub outputs: Vec<String>,
}

/// A MetaSchedule trace: its instructions and the decisions of its sampling instructions.
#[derive(Clone, Debug, PartialEq, Default)]
pub struct Trace {
    /// The instructions, in order.
    pub insts: Vec<Instruction>,
    /// Decision per instruction index.
    pub decisions: Vec<(usize, Value)>,
}

fn bad(msg: impl Into<String>) -> Error {
    Error::InvalidTrace(msg.into())
}

/// Instruction `n` of a trace, `[kind, inputs, attrs, outputs]`.
fn instruction(n: usize, inst: Value) -> Result<Instruction> {
    let Value::Array(parts) = inst else {
        return Err(bad(format!("instruction {n} is not an array")));
    };
    let Ok([kind, inputs, attrs, outputs]) = <[Value; 4]>::try_from(parts) else {
        return Err(bad(format!(
            "instruction {n} must be [kind, inputs, attrs, outputs]"
        )));
    };
    let Value::String(kind) = kind else {
        return Err(bad(format!("instruction {n}: kind is not a string")));
    };
    let list = |v: Value, what: &str| -> Result<Vec<Value>> {
        match v {
            Value::Array(items) => Ok(items),
            _ => Err(bad(format!(
                "instruction {n} ({kind}): {what} is not an array"
            ))),
        }
    };
    let outputs = list(outputs, "outputs")?
        .into_iter()
        .map(|o| match o {
            Value::String(name) => Ok(name),
            _ => Err(bad(format!(
                "instruction {n} ({kind}): output is not a name"
            ))),
        })
        .collect::<Result<_>>()?;
    Ok(Instruction {
        inputs: list(inputs, "inputs")?,
        attrs: list(attrs, "attrs")?,
        outputs,
        kind,
    })
}

impl Trace {
    /// Reads a trace's JSON text (`[instructions, decisions]`, or a MetaSchedule database line
    /// holding one).
    pub fn from_json(text: &str) -> Result<Trace> {
        let v: Value = serde_json::from_str(text).map_err(|e| bad(format!("trace JSON: {e}")))?;
        Trace::from_owned(v)
    }

    /// Reads a trace from its parsed JSON.
    pub fn from_value(v: &Value) -> Result<Trace> {
        Trace::from_owned(v.clone())
    }

    /// Reads a trace from its parsed JSON, taking its values instead of copying them.
    fn from_owned(v: Value) -> Result<Trace> {
        let Value::Array(mut top) = v else {
            return Err(bad("a trace must be [instructions, decisions]"));
        };
        // A line of a MetaSchedule JSON database, `[workload index, [trace, run_secs, target,
        // args_info]]`, stands for its trace: TVM's C++ writer makes these far faster than a
        // trace can be walked from Python.
        if let [Value::Number(_), Value::Array(record)] = top.as_mut_slice() {
            return match record.first_mut() {
                Some(trace) => Trace::from_owned(trace.take()),
                None => Err(bad("a database record without a trace")),
            };
        }
        let (insts, decisions) = match top.len() {
            2 => {
                let d = top.pop().unwrap_or(Value::Null);
                (top.pop().unwrap_or(Value::Null), d)
            }
            1 => (top.pop().unwrap_or(Value::Null), Value::Null),
            _ => return Err(bad("a trace must be [instructions, decisions]")),
        };
        let Value::Array(insts) = insts else {
            return Err(bad("instructions must be an array"));
        };
        let mut out = Trace::default();
        for (n, inst) in insts.into_iter().enumerate() {
            out.insts.push(instruction(n, inst)?);
        }
        match decisions {
            Value::Null => {}
            Value::Array(ds) => {
                for d in ds {
                    let Value::Array(pair) = d else {
                        return Err(bad("a decision must be [index, value]"));
                    };
                    let Ok([i, dec]) = <[Value; 2]>::try_from(pair) else {
                        return Err(bad("a decision must be [index, value]"));
                    };
                    let i = i
                        .as_u64()
                        .ok_or_else(|| bad("decision index is not a non-negative integer"))?
                        as usize;
                    if i >= out.insts.len() {
                        return Err(bad(format!(
                            "decision for instruction {i}, which does not exist"
                        )));
                    }
                    out.decisions.push((i, dec));
                }
            }
            _ => return Err(bad("decisions must be an array")),
        }
        Ok(out)
    }

    /// The trace's JSON form, as [`Trace::from_value`] reads it.
    pub fn to_value(&self) -> Value {
        let insts: Vec<Value> = self
            .insts
            .iter()
            .map(|i| json!([i.kind, i.inputs, i.attrs, i.outputs]))
            .collect();
        let decisions: Vec<Value> = self.decisions.iter().map(|(i, d)| json!([i, d])).collect();
        json!([insts, decisions])
    }

    /// The decision recorded for instruction `i`.
    pub fn decision(&self, i: usize) -> Option<&Value> {
        self.decisions.iter().find(|(j, _)| *j == i).map(|(_, d)| d)
    }
}

/// What a random variable stands for during replay.
#[derive(Clone, Debug, PartialEq)]
pub enum Rv {
    Block(BlockId),
    Loop(LoopId),
    Int(i64),
    /// SampleComputeLocation's "compute at root" (nothing to do).
    RootMark,
    /// SampleComputeLocation's "inline".
    InlineMark,
}

/// Replays instructions on a state, keeping the random variables.
pub struct Replayer<'a> {
    pub st: &'a mut State,
    pub rvs: HashMap<String, Rv>,
    pub rng: Rng,
    /// Instructions replayed after `EnterPostproc` are skipped when `skip_postproc` is set.
    pub skip_postproc: bool,
    /// The thread bindings and cooperative-fetch annotations replayed, in trace order: what
    /// RewriteCooperativeFetch reads from the trace.
    pub fetch_events: Vec<FetchEvent>,
}

/// A trace instruction RewriteCooperativeFetch reacts to.
#[derive(Clone, Debug, PartialEq)]
pub enum FetchEvent {
    /// A loop bound to `threadIdx.x` (`x`) or `threadIdx.y` (not `x`).
    Thread { x: bool, l: LoopId },
    /// A block annotated for warp execution: threadIdx.x spans a warp.
    Warp,
    /// A block annotated `meta_schedule.cooperative_fetch` with a vector lane count.
    Fetch { b: BlockId, lanes: i64 },
}

/// A literal input: a number, `null`, or a quoted string.
#[derive(Clone, Debug, PartialEq)]
enum Lit {
    Int(i64),
    Float(f64),
    Str(String),
    /// An array of integers, as MetaSchedule's software-pipeline annotations hold.
    Ints(Vec<i64>),
    Null,
}

impl<'a> Replayer<'a> {
    pub fn new(st: &'a mut State) -> Self {
        Replayer {
            st,
            rvs: HashMap::new(),
            rng: Rng::new(0),
            skip_postproc: false,
            fetch_events: Vec::new(),
        }
    }

    fn rv(&self, k: &str, v: &Value) -> Result<Rv> {
        let name = v
            .as_str()
            .ok_or_else(|| Error::schedule(k, format!("input {v} is not a random variable")))?;
        self.rvs
            .get(name)
            .cloned()
            .ok_or_else(|| bad(format!("{k}: unknown random variable {name}")))
    }

    fn block(&self, k: &str, v: &Value) -> Result<BlockId> {
        match self.rv(k, v)? {
            Rv::Block(b) if self.st.blocks[b].alive => Ok(b),
            Rv::Block(_) => Err(Error::schedule(k, format!("block {v} no longer exists"))),
            other => Err(Error::schedule(k, format!("{v} is {other:?}, not a block"))),
        }
    }

    fn lp(&self, k: &str, v: &Value) -> Result<LoopId> {
        match self.rv(k, v)? {
            Rv::Loop(l) if self.st.loops[l].alive => Ok(l),
            Rv::Loop(_) => Err(Error::schedule(k, format!("loop {v} no longer exists"))),
            other => Err(Error::schedule(k, format!("{v} is {other:?}, not a loop"))),
        }
    }

    /// A literal or the integer value of a random variable.
    fn value(&self, k: &str, v: &Value) -> Result<Lit> {
        Ok(match v {
            // TVM writes a missing split factor as the bare string `None`.
            Value::Null => Lit::Null,
            Value::String(s) if s == "None" => Lit::Null,
            Value::Bool(b) => Lit::Int(*b as i64),
            Value::Number(n) => match n.as_i64() {
                Some(i) => Lit::Int(i),
                None => Lit::Float(n.as_f64().unwrap_or(0.0)),
            },
            Value::String(s) if s.len() >= 2 && s.starts_with('"') && s.ends_with('"') => {
                Lit::Str(s[1..s.len() - 1].to_string())
            }
            Value::String(_) => match self.rv(k, v)? {
                Rv::Int(i) => Lit::Int(i),
                other => return Err(Error::schedule(k, format!("{v} is {other:?}, not a value"))),
            },
            Value::Array(a) => Lit::Ints(
                a.iter()
                    .map(|x| x.as_i64())
                    .collect::<Option<Vec<_>>>()
                    .ok_or_else(|| bad(format!("{k}: unexpected input {v}")))?,
            ),
            _ => return Err(bad(format!("{k}: unexpected input {v}"))),
        })
    }

    fn attr_int(k: &str, attrs: &[Value], i: usize) -> Result<i64> {
        match attrs.get(i) {
            Some(Value::Bool(b)) => Ok(*b as i64),
            Some(v) => v
                .as_i64()
                .ok_or_else(|| bad(format!("{k}: attribute {i} is not an integer"))),
            None => Err(bad(format!("{k}: missing attribute {i}"))),
        }
    }

    fn attr_str<'v>(k: &str, attrs: &'v [Value], i: usize) -> Result<&'v str> {
        attrs
            .get(i)
            .and_then(Value::as_str)
            .ok_or_else(|| bad(format!("{k}: attribute {i} is not a string")))
    }

    fn bind(&mut self, k: &str, outputs: &[String], values: Vec<Rv>) -> Result<()> {
        if outputs.len() != values.len() {
            return Err(Error::schedule(
                k,
                format!(
                    "the trace names {} outputs, the instruction gives {}",
                    outputs.len(),
                    values.len()
                ),
            ));
        }
        for (o, v) in outputs.iter().zip(values) {
            self.rvs.insert(o.clone(), v);
        }
        Ok(())
    }

    fn input(inst: &Instruction, i: usize) -> Result<&Value> {
        inst.inputs
            .get(i)
            .ok_or_else(|| bad(format!("{}: missing input {i}", inst.kind)))
    }

    /// Replays a whole trace. Returns the trace with the decisions actually taken.
    pub fn replay(&mut self, trace: &Trace) -> Result<Trace> {
        let mut taken = Trace {
            insts: Vec::new(),
            decisions: Vec::new(),
        };
        for (i, inst) in trace.insts.iter().enumerate() {
            if inst.kind == "EnterPostproc" && self.skip_postproc {
                break;
            }
            let decision = self.apply(inst, trace.decision(i))?;
            if let Some(d) = decision {
                taken.decisions.push((taken.insts.len(), d));
            }
            taken.insts.push(inst.clone());
        }
        Ok(taken)
    }

    /// Applies one instruction; returns its decision for sampling instructions.
    pub fn apply(&mut self, inst: &Instruction, decision: Option<&Value>) -> Result<Option<Value>> {
        match inst.kind.as_str() {
            "GetSBlock" | "GetBlock" | "GetLoops" | "GetChildBlocks" | "GetConsumers"
            | "GetProducers" => self.apply_query(inst)?,
            "Split" | "Fuse" | "Reorder" | "Parallel" | "Vectorize" | "Unroll" | "Bind"
            | "Annotate" | "Unannotate" => self.apply_loop_or_annotation(inst)?,
            "SamplePerfectTile" | "SampleCategorical" | "SampleComputeLocation" => {
                return self.apply_sample(inst, decision)
            }
            "EnterPostproc" => {}
            _ => self.apply_block_transform(inst)?,
        }
        Ok(None)
    }

    /// The queries: blocks, loops, children, producers and consumers.
    fn apply_query(&mut self, inst: &Instruction) -> Result<()> {
        let k = inst.kind.as_str();
        let inp = |i: usize| Replayer::input(inst, i);
        match k {
            "GetSBlock" | "GetBlock" => {
                let name = Self::attr_str(k, &inst.attrs, 0)?;
                let b = self
                    .st
                    .block_by_name(name)
                    .ok_or_else(|| Error::schedule(k, format!("no block named {name}")))?;
                self.bind(k, &inst.outputs, vec![Rv::Block(b)])?;
            }
            "GetLoops" => {
                let b = self.block(k, inp(0)?)?;
                let ls = self.st.loops_of(b).into_iter().map(Rv::Loop).collect();
                self.bind(k, &inst.outputs, ls)?;
            }
            "GetChildBlocks" => {
                let parent = match self.rv(k, inp(0)?)? {
                    Rv::Block(b) if b == self.st.root => None,
                    Rv::Loop(l) if self.st.loops[l].alive => Some(l),
                    _ => {
                        return Err(Error::schedule(
                            k,
                            "the input is neither the root block nor a live loop",
                        ))
                    }
                };
                let bs = self
                    .st
                    .blocks_under(parent)
                    .into_iter()
                    .map(Rv::Block)
                    .collect();
                self.bind(k, &inst.outputs, bs)?;
            }
            "GetConsumers" | "GetProducers" => {
                let b = self.block(k, inp(0)?)?;
                let bs = if k == "GetConsumers" {
                    self.st.consumers(b)
                } else {
                    self.st.producers(b)
                };
                self.bind(k, &inst.outputs, bs.into_iter().map(Rv::Block).collect())?;
            }
            _ => return Err(Error::schedule(k, "instruction kind not supported")),
        }
        Ok(())
    }

    /// Loop transformations and annotations.
    fn apply_loop_or_annotation(&mut self, inst: &Instruction) -> Result<()> {
        let k = inst.kind.as_str();
        let inp = |i: usize| Replayer::input(inst, i);
        match k {
            "Split" => {
                let l = self.lp(k, inp(0)?)?;
                let factors = inst.inputs[1..]
                    .iter()
                    .map(|v| match self.value(k, v)? {
                        Lit::Null => Ok(None),
                        Lit::Int(i) => Ok(Some(i)),
                        other => Err(bad(format!("{k}: factor {other:?} is not an integer"))),
                    })
                    .collect::<Result<Vec<_>>>()?;
                let preserve = Self::attr_int(k, &inst.attrs, 0).unwrap_or(1) != 0;
                let no_pred = Self::attr_int(k, &inst.attrs, 1).unwrap_or(0) != 0;
                let ls = loops::split(self.st, l, &factors, preserve, no_pred)?;
                self.bind(k, &inst.outputs, ls.into_iter().map(Rv::Loop).collect())?;
            }
            "Fuse" => {
                let ls = inst
                    .inputs
                    .iter()
                    .map(|v| self.lp(k, v))
                    .collect::<Result<Vec<_>>>()?;
                let preserve = Self::attr_int(k, &inst.attrs, 0).unwrap_or(1) != 0;
                let f = loops::fuse(self.st, &ls, preserve)?;
                self.bind(k, &inst.outputs, vec![Rv::Loop(f)])?;
            }
            "Reorder" => {
                let ls = inst
                    .inputs
                    .iter()
                    .map(|v| self.lp(k, v))
                    .collect::<Result<Vec<_>>>()?;
                loops::reorder(self.st, &ls)?;
            }
            "Parallel" => {
                loops::set_kind(self.st, k, self.lp(k, inp(0)?)?, LoopKind::Parallel, None)?
            }
            "Vectorize" => {
                loops::set_kind(self.st, k, self.lp(k, inp(0)?)?, LoopKind::Vectorized, None)?
            }
            "Unroll" => {
                loops::set_kind(self.st, k, self.lp(k, inp(0)?)?, LoopKind::Unrolled, None)?
            }
            "Bind" => {
                let thread = Self::attr_str(k, &inst.attrs, 0)?.to_string();
                let l = self.lp(k, inp(0)?)?;
                if thread == "threadIdx.x" || thread == "threadIdx.y" {
                    let x = thread == "threadIdx.x";
                    self.fetch_events.push(FetchEvent::Thread { x, l });
                }
                loops::set_kind(self.st, k, l, LoopKind::ThreadBinding, Some(thread))?
            }
            // TVM keeps an existing annotation: annotating the same key again is a no-op.
            "Annotate" => {
                let key = Self::attr_str(k, &inst.attrs, 0)?.to_string();
                let value = match self.value(k, inp(1)?)? {
                    Lit::Int(i) => json!(i),
                    Lit::Float(f) => json!(f),
                    Lit::Str(s) => json!(s),
                    Lit::Ints(v) => json!(v),
                    Lit::Null => return Err(bad(format!("{k}: null annotation value"))),
                };
                match self.rv(k, inp(0)?)? {
                    Rv::Block(b) if self.st.blocks[b].alive => {
                        match (key.as_str(), &value) {
                            ("meta_schedule.cooperative_fetch", v) => {
                                let lanes = v.as_i64().unwrap_or(1);
                                self.fetch_events.push(FetchEvent::Fetch { b, lanes });
                            }
                            ("warp_execution", _) => self.fetch_events.push(FetchEvent::Warp),
                            _ => {}
                        }
                        self.st.blocks[b]
                            .block
                            .annotations
                            .entry(key)
                            .or_insert(value);
                    }
                    Rv::Loop(l) if self.st.loops[l].alive => {
                        self.st.loops[l].annotations.entry(key).or_insert(value);
                    }
                    _ => return Err(Error::schedule(k, "the target is not a live block or loop")),
                }
            }
            "Unannotate" => {
                let key = Self::attr_str(k, &inst.attrs, 0)?;
                match self.rv(k, inp(0)?)? {
                    Rv::Block(b) if self.st.blocks[b].alive => {
                        self.st.blocks[b].block.annotations.remove(key);
                    }
                    Rv::Loop(l) if self.st.loops[l].alive => {
                        self.st.loops[l].annotations.remove(key);
                    }
                    _ => return Err(Error::schedule(k, "the target is not a live block or loop")),
                }
            }
            _ => return Err(Error::schedule(k, "instruction kind not supported")),
        }
        Ok(())
    }

    /// The sampling instructions: replays `decision` where given, else draws; returns the decision.
    fn apply_sample(
        &mut self,
        inst: &Instruction,
        decision: Option<&Value>,
    ) -> Result<Option<Value>> {
        let k = inst.kind.as_str();
        let inp = |i: usize| Replayer::input(inst, i);
        match k {
            "SamplePerfectTile" => {
                let l = self.lp(k, inp(0)?)?;
                let n = Self::attr_int(k, &inst.attrs, 0)?;
                let max_inner = Self::attr_int(k, &inst.attrs, 1)?;
                let extent = self.st.loops[l].extent;
                let factors: Vec<i64> = match decision {
                    Some(d) => {
                        let fs: Vec<i64> = d
                            .as_array()
                            .and_then(|a| a.iter().map(Value::as_i64).collect::<Option<Vec<_>>>())
                            .ok_or_else(|| {
                                bad(format!("{k}: decision {d} is not a list of integers"))
                            })?;
                        if fs.len() as i64 != n
                            || fs.iter().product::<i64>() != extent
                            || fs.iter().any(|&f| f <= 0)
                        {
                            return Err(Error::schedule(
                                k,
                                format!("decision {fs:?} is not a perfect {n}-tiling of {extent}"),
                            ));
                        }
                        fs
                    }
                    None => sample_perfect_tile(&mut self.rng, extent, n, max_inner).ok_or_else(
                        || Error::schedule(k, format!("cannot tile {extent} into {n} parts")),
                    )?,
                };
                self.bind(
                    k,
                    &inst.outputs,
                    factors.iter().map(|&f| Rv::Int(f)).collect(),
                )?;
                Ok(Some(json!(factors)))
            }
            "SampleCategorical" => {
                let cands: Vec<i64> = inst
                    .attrs
                    .first()
                    .and_then(Value::as_array)
                    .and_then(|a| a.iter().map(Value::as_i64).collect())
                    .ok_or_else(|| bad(format!("{k}: candidates are not integers")))?;
                let probs: Vec<f64> = inst
                    .attrs
                    .get(1)
                    .and_then(Value::as_array)
                    .and_then(|a| a.iter().map(Value::as_f64).collect())
                    .ok_or_else(|| bad(format!("{k}: probabilities are not numbers")))?;
                if cands.is_empty() || cands.len() != probs.len() {
                    return Err(bad(format!(
                        "{k}: candidates and probabilities differ in length"
                    )));
                }
                let idx = match decision {
                    Some(d) => d
                        .as_i64()
                        .ok_or_else(|| bad(format!("{k}: decision {d} is not an integer")))?,
                    None => self.rng.weighted(&probs) as i64,
                };
                let v = usize::try_from(idx)
                    .ok()
                    .and_then(|i| cands.get(i))
                    .ok_or_else(|| Error::schedule(k, format!("decision {idx} out of range")))?;
                self.bind(k, &inst.outputs, vec![Rv::Int(*v)])?;
                Ok(Some(json!(idx)))
            }
            "SampleComputeLocation" => {
                let b = self.block(k, inp(0)?)?;
                let d = decision
                    .ok_or_else(|| {
                        Error::schedule(
                            k,
                            "sampling a compute location needs a decision (not implemented)",
                        )
                    })?
                    .as_i64()
                    .ok_or_else(|| bad(format!("{k}: decision is not an integer")))?;
                let rv = match d {
                    -2 => Rv::InlineMark,
                    -1 => Rv::RootMark,
                    i => {
                        let c = *self.st.consumers(b).first().ok_or_else(|| {
                            Error::schedule(k, "the block has no consumer to compute at")
                        })?;
                        let ls = self.st.loops_of(c);
                        Rv::Loop(*usize::try_from(i).ok().and_then(|i| ls.get(i)).ok_or_else(
                            || Error::schedule(k, format!("location {i} out of range")),
                        )?)
                    }
                };
                self.bind(k, &inst.outputs, vec![rv])?;
                Ok(Some(json!(d)))
            }
            _ => Err(Error::schedule(k, "instruction kind not supported")),
        }
    }

    /// Block transformations: compute locations, inlining, caches and reductions.
    fn apply_block_transform(&mut self, inst: &Instruction) -> Result<()> {
        let k = inst.kind.as_str();
        let inp = |i: usize| Replayer::input(inst, i);
        match k {
            "ComputeAt" | "ReverseComputeAt" => {
                let b = self.block(k, inp(0)?)?;
                let reverse = k == "ReverseComputeAt";
                match self.rv(k, inp(1)?)? {
                    Rv::RootMark => {}
                    Rv::InlineMark if reverse => compute::reverse_compute_inline(self.st, b)?,
                    Rv::InlineMark => compute::compute_inline(self.st, b)?,
                    Rv::Loop(l) => {
                        let preserve = Self::attr_int(k, &inst.attrs, 0).unwrap_or(0) != 0;
                        let index = Self::attr_int(k, &inst.attrs, 1).unwrap_or(-1);
                        compute::compute_at(self.st, b, l, preserve, index, reverse)?;
                    }
                    other => return Err(Error::schedule(k, format!("{other:?} is not a loop"))),
                }
            }
            "ComputeInline" => compute::compute_inline(self.st, self.block(k, inp(0)?)?)?,
            "ReverseComputeInline" => {
                compute::reverse_compute_inline(self.st, self.block(k, inp(0)?)?)?
            }
            "CacheWrite" | "CacheRead" => {
                let b = self.block(k, inp(0)?)?;
                let index = Self::attr_int(k, &inst.attrs, 0)?;
                let scope = Self::attr_str(k, &inst.attrs, 1)?.to_string();
                let consumers = match inst.inputs.get(1) {
                    Some(Value::Array(a)) => a
                        .iter()
                        .map(|v| self.block(k, v))
                        .collect::<Result<Vec<_>>>()?,
                    _ => vec![],
                };
                let nb = if k == "CacheWrite" {
                    if !consumers.is_empty() {
                        return Err(Error::schedule(
                            k,
                            "cache_write with explicit consumer blocks is not supported",
                        ));
                    }
                    cache::cache_write(self.st, b, index, &scope)?
                } else {
                    cache::cache_read(self.st, b, index, &scope, &consumers)?
                };
                self.bind(k, &inst.outputs, vec![Rv::Block(nb)])?;
            }
            "AddUnitLoop" => {
                let target = match self.rv(k, inp(0)?)? {
                    Rv::Block(b) if self.st.blocks[b].alive => Child::Block(b),
                    Rv::Loop(l) if self.st.loops[l].alive => Child::Loop(l),
                    _ => return Err(Error::schedule(k, "the target is not a live block or loop")),
                };
                let l = gpu_postproc::add_unit_loop(self.st, target)?;
                self.bind(k, &inst.outputs, vec![Rv::Loop(l)])?;
            }
            "SetScope" => {
                let b = self.block(k, inp(0)?)?;
                let index = Self::attr_int(k, &inst.attrs, 0)?;
                let scope = Self::attr_str(k, &inst.attrs, 1)?;
                cache::set_scope(self.st, b, index, scope)?;
            }
            "RFactor" => {
                let l = self.lp(k, inp(0)?)?;
                let axis = Self::attr_int(k, &inst.attrs, 0)?;
                let b = reduction::rfactor(self.st, l, axis)?;
                self.bind(k, &inst.outputs, vec![Rv::Block(b)])?;
            }
            "DecomposeReduction" => {
                let b = self.block(k, inp(0)?)?;
                let l = self.lp(k, inp(1)?)?;
                let ib = reduction::decompose_reduction(self.st, b, l)?;
                self.bind(k, &inst.outputs, vec![Rv::Block(ib)])?;
            }
            _ => return Err(Error::schedule(k, "instruction kind not supported")),
        }
        Ok(())
    }
}

/// A random perfect tiling of `extent` into `n` factors, innermost at most `max_inner`.
fn sample_perfect_tile(rng: &mut Rng, extent: i64, n: i64, max_inner: i64) -> Option<Vec<i64>> {
    if n <= 0 || extent <= 0 {
        return None;
    }
    let n = n as usize;
    for _ in 0..64 {
        let mut rest = extent;
        let mut fs = vec![1i64; n];
        for f in fs.iter_mut().skip(1).rev() {
            let divs: Vec<i64> = (1..=rest).filter(|d| rest % d == 0).collect();
            *f = *rng.choose(&divs);
            rest /= *f;
        }
        fs[0] = rest;
        if fs[n - 1] <= max_inner.max(1) {
            return Some(fs);
        }
    }
    None
}

/// Replays `trace` on the state; with `postprocess`, stops at `EnterPostproc` and runs the CPU
/// postprocessors instead of replaying their instructions.
pub fn apply_trace(st: &mut State, trace: &Trace, postprocess: bool) -> Result<()> {
    let mut r = Replayer::new(st);
    r.skip_postproc = postprocess;
    r.replay(trace)?;
    if postprocess {
        postproc::rewrite_parallel_vectorize_unroll(r.st)?;
        postproc::rewrite_reduction_block(r.st)?;
    }
    Ok(())
}

/// Replays `trace` on the state for a CUDA `target`; with `postprocess`, stops at
/// `EnterPostproc` and runs MetaSchedule's CUDA postprocessors in TVM's order instead
/// (RewriteCooperativeFetch, RewriteUnboundBlock, RewriteParallelVectorizeUnroll,
/// RewriteReductionBlock; DisallowDynamicLoop is the engine's refusal of dynamic extents).
pub fn apply_trace_gpu(
    st: &mut State,
    trace: &Trace,
    target: &GpuTarget,
    postprocess: bool,
) -> Result<()> {
    let mut r = Replayer::new(st);
    r.skip_postproc = postprocess;
    r.replay(trace)?;
    if postprocess {
        let events = std::mem::take(&mut r.fetch_events);
        gpu_postproc::rewrite_cooperative_fetch(r.st, &events, target)?;
        gpu_postproc::rewrite_unbound_block(r.st, target)?;
        postproc::rewrite_parallel_vectorize_unroll(r.st)?;
        postproc::rewrite_reduction_block(r.st)?;
    }
    Ok(())
}
