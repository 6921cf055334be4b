//! JSON -> [`Program`]: strict parsing with errors that name what is wrong.

use std::collections::BTreeMap;

use serde_json::Value;

use super::expr::as_i64;
use super::*;
use crate::error::{Error, Result};

fn field<'a>(v: &'a Value, key: &str, ctx: &str) -> Result<&'a Value> {
    v.get(key)
        .ok_or_else(|| Error::Malformed(format!("{ctx}: missing field `{key}`")))
}

fn str_field(v: &Value, key: &str, ctx: &str) -> Result<String> {
    field(v, key, ctx)?
        .as_str()
        .map(str::to_string)
        .ok_or_else(|| Error::Malformed(format!("{ctx}: field `{key}` must be a string")))
}

fn array<'a>(v: &'a Value, key: &str, ctx: &str) -> Result<&'a Vec<Value>> {
    field(v, key, ctx)?
        .as_array()
        .ok_or_else(|| Error::Malformed(format!("{ctx}: field `{key}` must be an array")))
}

fn index(v: &Value, bound: usize, what: &str) -> Result<usize> {
    let i = as_i64(v, what)?;
    if i < 0 || i as usize >= bound {
        return Err(Error::Malformed(format!(
            "{what} {i} out of range (0..{bound})"
        )));
    }
    Ok(i as usize)
}

fn annotations(v: &Value, ctx: &str) -> Result<BTreeMap<String, Value>> {
    match v.get("annotations") {
        None | Some(Value::Null) => Ok(BTreeMap::new()),
        Some(Value::Object(m)) => Ok(m.iter().map(|(k, v)| (k.clone(), v.clone())).collect()),
        Some(_) => Err(Error::Malformed(format!(
            "{ctx}: annotations must be an object"
        ))),
    }
}

struct Importer {
    n_buffers: usize,
    n_blocks: usize,
}

impl Importer {
    fn expr(&self, v: &Value) -> Result<Expr> {
        Expr::from_json(v, self.n_buffers)
    }

    fn access(&self, v: &Value, ctx: &str) -> Result<Access> {
        let buffer = index(field(v, "buffer", ctx)?, self.n_buffers, "buffer index")?;
        let region = array(v, "region", ctx)?
            .iter()
            .map(|r| match r.as_array().map(Vec::as_slice) {
                Some([min, extent]) => Ok((self.expr(min)?, self.expr(extent)?)),
                _ => Err(Error::Malformed(format!(
                    "{ctx}: a region range must be [min, extent]"
                ))),
            })
            .collect::<Result<_>>()?;
        Ok(Access { buffer, region })
    }

    fn stores(&self, v: &Value, ctx: &str) -> Result<Vec<Store>> {
        v.as_array()
            .ok_or_else(|| Error::Malformed(format!("{ctx}: stores must be an array")))?
            .iter()
            .map(|s| {
                Ok(Store {
                    buffer: index(field(s, "buffer", ctx)?, self.n_buffers, "buffer index")?,
                    indices: array(s, "indices", ctx)?
                        .iter()
                        .map(|e| self.expr(e))
                        .collect::<Result<_>>()?,
                    value: self.expr(field(s, "value", ctx)?)?,
                })
            })
            .collect()
    }

    fn nodes(&self, v: &Value, ctx: &str) -> Result<Vec<Node>> {
        v.as_array()
            .ok_or_else(|| Error::Malformed(format!("{ctx}: body must be an array")))?
            .iter()
            .map(|n| self.node(n, ctx))
            .collect()
    }

    fn node(&self, v: &Value, ctx: &str) -> Result<Node> {
        match str_field(v, "node", ctx)?.as_str() {
            "loop" => {
                let var = str_field(v, "var", ctx)?;
                let lctx = format!("loop {var}");
                let kind_name = str_field(v, "kind", &lctx)?;
                let kind = LoopKind::from_name(&kind_name).ok_or_else(|| {
                    Error::Unsupported(format!("{lctx}: loop kind `{kind_name}`"))
                })?;
                let extent = as_i64(field(v, "extent", &lctx)?, "loop extent")?;
                if extent <= 0 {
                    return Err(Error::Malformed(format!(
                        "{lctx}: extent {extent} is not positive"
                    )));
                }
                Ok(Node::Loop(Loop {
                    min: as_i64(field(v, "min", &lctx)?, "loop min")?,
                    extent,
                    kind,
                    thread: v.get("thread").and_then(Value::as_str).map(str::to_string),
                    annotations: annotations(v, &lctx)?,
                    body: self.nodes(field(v, "body", &lctx)?, &lctx)?,
                    var,
                }))
            }
            "block" => Ok(Node::Block(self.realize(v, ctx)?)),
            other => Err(Error::Malformed(format!(
                "{ctx}: unknown node kind `{other}`"
            ))),
        }
    }

    fn realize(&self, v: &Value, ctx: &str) -> Result<BlockRealize> {
        Ok(BlockRealize {
            block: index(field(v, "block", ctx)?, self.n_blocks, "block index")?,
            bindings: array(v, "bindings", ctx)?
                .iter()
                .map(|e| self.expr(e))
                .collect::<Result<_>>()?,
            predicate: self.expr(field(v, "predicate", ctx)?)?,
        })
    }

    fn block(&self, v: &Value) -> Result<Block> {
        let name = str_field(v, "name", "block")?;
        let ctx = format!("block {name}");
        let iter_vars = array(v, "iter_vars", &ctx)?
            .iter()
            .map(|iv| {
                let kind = match str_field(iv, "kind", &ctx)?.as_str() {
                    "S" => IterKind::Spatial,
                    "R" => IterKind::Reduce,
                    "O" => IterKind::Opaque,
                    k => return Err(Error::Unsupported(format!("{ctx}: iteration kind `{k}`"))),
                };
                let extent = as_i64(field(iv, "extent", &ctx)?, "iteration extent")?;
                if extent <= 0 {
                    return Err(Error::Malformed(format!(
                        "{ctx}: iteration extent {extent} is not positive"
                    )));
                }
                Ok(IterVar {
                    name: str_field(iv, "name", &ctx)?,
                    min: as_i64(field(iv, "min", &ctx)?, "iteration min")?,
                    extent,
                    kind,
                })
            })
            .collect::<Result<_>>()?;
        let init = match v.get("init") {
            None | Some(Value::Null) => None,
            Some(s) => Some(self.stores(s, &ctx)?),
        };
        let children = match v.get("children") {
            None | Some(Value::Null) => None,
            Some(c) => Some(self.nodes(c, &ctx)?),
        };
        Ok(Block {
            iter_vars,
            reads: array(v, "reads", &ctx)?
                .iter()
                .map(|a| self.access(a, &ctx))
                .collect::<Result<_>>()?,
            writes: array(v, "writes", &ctx)?
                .iter()
                .map(|a| self.access(a, &ctx))
                .collect::<Result<_>>()?,
            init,
            body: self.stores(field(v, "body", &ctx)?, &ctx)?,
            children,
            alloc_buffers: array(v, "alloc_buffers", &ctx)?
                .iter()
                .map(|b| index(b, self.n_buffers, "buffer index"))
                .collect::<Result<_>>()?,
            annotations: annotations(v, &ctx)?,
            name,
        })
    }
}

pub(super) fn program_from_json(text: &str) -> Result<Program> {
    let v: Value =
        serde_json::from_str(text).map_err(|e| Error::Malformed(format!("program JSON: {e}")))?;
    let buffers = array(&v, "buffers", "program")?
        .iter()
        .map(|b| {
            let name = str_field(b, "name", "buffer")?;
            let ctx = format!("buffer {name}");
            let shape = array(b, "shape", &ctx)?
                .iter()
                .map(|d| {
                    let d = as_i64(d, "buffer dimension")?;
                    if d < 0 {
                        return Err(Error::Malformed(format!("{ctx}: negative dimension {d}")));
                    }
                    Ok(d)
                })
                .collect::<Result<_>>()?;
            Ok(Buffer {
                shape,
                dtype: str_field(b, "dtype", &ctx)?,
                scope: str_field(b, "scope", &ctx)?,
                name,
            })
        })
        .collect::<Result<Vec<_>>>()?;
    let block_values = array(&v, "blocks", "program")?;
    let imp = Importer {
        n_buffers: buffers.len(),
        n_blocks: block_values.len(),
    };
    let blocks = block_values
        .iter()
        .map(|b| imp.block(b))
        .collect::<Result<Vec<_>>>()?;
    let params = array(&v, "params", "program")?
        .iter()
        .map(|p| index(p, buffers.len(), "parameter buffer index"))
        .collect::<Result<_>>()?;
    let root = imp.realize(field(&v, "root", "program")?, "root")?;
    if blocks[root.block].children.is_none() {
        return Err(Error::Malformed(
            "the root block has no child statements".into(),
        ));
    }
    let program = Program {
        name: str_field(&v, "name", "program")?,
        params,
        buffers,
        blocks,
        root,
    };
    validate(&program)?;
    Ok(program)
}

/// Structural checks the rest of the core relies on.
fn validate(p: &Program) -> Result<()> {
    let mut seen = vec![0usize; p.blocks.len()];
    fn count(p: &Program, nodes: &[Node], seen: &mut [usize]) {
        for n in nodes {
            match n {
                Node::Loop(l) => count(p, &l.body, seen),
                Node::Block(r) => {
                    seen[r.block] += 1;
                    // A block placed twice is an error below; descending again could cycle
                    // (a block placed inside itself) and never end.
                    if seen[r.block] > 1 {
                        continue;
                    }
                    if let Some(c) = &p.blocks[r.block].children {
                        count(p, c, seen);
                    }
                }
            }
        }
    }
    seen[p.root.block] += 1;
    count(
        p,
        p.blocks[p.root.block].children.as_deref().unwrap_or(&[]),
        &mut seen,
    );
    for (i, s) in seen.iter().enumerate() {
        if *s != 1 {
            return Err(Error::Malformed(format!(
                "block {} is placed {s} times in the loop tree",
                p.blocks[i].name
            )));
        }
    }
    for b in &p.blocks {
        if b.children.is_some() && b.name != p.blocks[p.root.block].name {
            return Err(Error::Unsupported(format!(
                "nested block `{}` with child statements",
                b.name
            )));
        }
    }
    Ok(())
}
