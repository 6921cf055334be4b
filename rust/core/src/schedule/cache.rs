//! cache_read and cache_write: a copy stage between a block and a new buffer in another scope.

use super::arith::{self, Lin, Ranges};
use super::state::{BlockId, Child, LoopId, State};
use crate::error::{Error, Result};
use crate::program::{Access, Block, Buffer, Expr, IterKind, IterVar, Store};

fn rename_buffer(e: &Expr, from: usize, to: usize) -> Expr {
    super::compute::replace_loads(e, from, &|indices| Expr::Load {
        buffer: to,
        indices: indices.to_vec(),
    })
}

/// Replaces buffer `from` by `to` in a block's accesses (reads if `reads`, writes if `writes`).
fn retarget(block: &mut Block, from: usize, to: usize, reads: bool, writes: bool) {
    if reads {
        for a in block.reads.iter_mut().filter(|a| a.buffer == from) {
            a.buffer = to;
        }
        for s in block.body.iter_mut().chain(block.init.iter_mut().flatten()) {
            s.value = rename_buffer(&s.value, from, to);
        }
    }
    if writes {
        for a in block.writes.iter_mut().filter(|a| a.buffer == from) {
            a.buffer = to;
        }
        for s in block.body.iter_mut().chain(block.init.iter_mut().flatten()) {
            if s.buffer == from {
                s.buffer = to;
            }
        }
    }
}

/// The region an access covers over the loops of its block below `under` (all loops when
/// `None`): per dimension a symbolic start (in the outer loops), an offset and an extent.
fn relaxed_region(
    st: &State,
    inst: &str,
    b: BlockId,
    acc: &Access,
    under: Option<LoopId>,
) -> Result<Vec<(Lin, i64, i64)>> {
    let sb = &st.blocks[b];
    let map = |v: &str| sb.binding_of(v);
    let all = st.ranges();
    let loops = st.loops_of(b);
    let start = under
        .and_then(|u| loops.iter().position(|&l| l == u))
        .map(|i| i + 1)
        .unwrap_or(0);
    let relaxed: Ranges = loops[start..]
        .iter()
        .map(|&l| (st.loops[l].var.clone(), st.loops[l].extent))
        .collect();
    let shape = st.buffers[acc.buffer].shape.clone();
    let predicated = sb.predicate != Expr::Bool(true);
    acc.region
        .iter()
        .enumerate()
        .map(|(d, (min, ext))| {
            let ext = ext
                .substitute(&map)
                .as_int()
                .ok_or_else(|| Error::schedule(inst, "non-constant region extent"))?;
            let iv = arith::relax(&min.substitute(&map), &relaxed, &all)
                .filter(|iv| iv.exact)
                .ok_or_else(|| Error::schedule(inst, "cannot bound the cached region"))?;
            if !iv.base.is_constant() || !predicated {
                return Ok((iv.base, iv.lo, iv.hi - iv.lo + ext));
            }
            // A predicated block (a split tail) stays inside the buffer: clip.
            let lo = (iv.base.constant + iv.lo).max(0);
            let hi =
                (iv.base.constant + iv.hi + ext - 1).min(shape.get(d).copied().unwrap_or(1) - 1);
            Ok((Lin::constant(0), lo, (hi - lo + 1).max(1)))
        })
        .collect()
}

/// A copy block `dst[v] = src[v]` over `region`, under a fresh loop nest; returns the block and
/// the outermost new node. Its variables span the buffer; their bindings start at the region.
fn copy_stage(
    st: &mut State,
    name: String,
    src: usize,
    dst: usize,
    region: &[(Lin, i64, i64)],
) -> (BlockId, Child) {
    let shape = st.buffers[src].shape.clone();
    let iter_vars: Vec<IterVar> = (0..region.len())
        .map(|i| IterVar {
            name: format!("v{i}"),
            min: 0,
            extent: shape.get(i).copied().unwrap_or(1).max(1),
            kind: IterKind::Spatial,
        })
        .collect();
    let idx: Vec<Expr> = (0..region.len())
        .map(|i| Expr::Var(format!("v{i}")))
        .collect();
    let point = |buffer: usize| Access {
        buffer,
        region: idx.iter().map(|e| (e.clone(), Expr::Int(1))).collect(),
    };
    let block = Block {
        name,
        iter_vars,
        reads: vec![point(src)],
        writes: vec![point(dst)],
        init: None,
        body: vec![Store {
            buffer: dst,
            indices: idx.clone(),
            value: Expr::Load {
                buffer: src,
                indices: idx.clone(),
            },
        }],
        children: None,
        alloc_buffers: vec![],
        annotations: Default::default(),
    };
    let mut parent: Option<LoopId> = None;
    let mut outer = None;
    let mut bindings = Vec::new();
    for (base, lo, ext) in region {
        let l = st.new_loop(*ext, parent);
        if let Some(p) = parent {
            st.loops[p].children.push(Child::Loop(l));
        }
        outer.get_or_insert(Child::Loop(l));
        let start = base.add(&Lin::constant(*lo), 1);
        bindings.push(
            start
                .add(&Lin::atom(Expr::Var(st.loops[l].var.clone())), 1)
                .to_expr(),
        );
        parent = Some(l);
    }
    let blk = st.new_block(block, bindings, parent);
    if let Some(p) = parent {
        st.loops[p].children.push(Child::Block(blk));
    }
    (blk, outer.unwrap_or(Child::Block(blk)))
}

/// TVM's CacheLocDetector: from the block's parent upward, the first (innermost) loop whose
/// children hold a subtree with one of `related` after the subtree holding `b`; the stage goes
/// right before that subtree. At the root without such a subtree: after `b`'s subtree, or at
/// the end when `b` is not found.
fn cache_location(st: &State, b: BlockId, related: &[BlockId]) -> (Option<LoopId>, usize) {
    let mut p = st.blocks[b].parent;
    loop {
        let kids = st.children(p);
        if let Some(i) = subtree_index(st, p, b) {
            let hit = (i + 1..kids.len()).find(|&j| {
                let mut v = Vec::new();
                st.blocks_in(kids[j], &mut v);
                v.iter().any(|x| related.contains(x))
            });
            if let Some(j) = hit {
                return (p, j);
            }
            if p.is_none() {
                return (
                    None,
                    if related.is_empty() {
                        kids.len()
                    } else {
                        i + 1
                    },
                );
            }
        }
        match p {
            Some(l) => p = st.loops[l].parent,
            None => return (None, kids.len()),
        }
    }
}

/// The child of `parent` whose subtree holds block `b`.
fn subtree_index(st: &State, parent: Option<LoopId>, b: BlockId) -> Option<usize> {
    st.children(parent).iter().position(|&c| {
        let mut v = Vec::new();
        st.blocks_in(c, &mut v);
        v.contains(&b)
    })
}

/// The cache buffer. Like TVM, a stage placed at the root covers only its region: the buffer
/// then has the region's shape; a stage inside a loop gets the whole shape.
fn new_cache_buffer(
    st: &mut State,
    buffer: usize,
    scope: &str,
    at_root: bool,
    region: &[(Lin, i64, i64)],
) -> usize {
    let old = st.buffers[buffer].clone();
    let shape = if at_root && region.iter().all(|(b, _, _)| b.is_constant()) {
        region.iter().map(|(_, _, e)| *e).collect()
    } else {
        old.shape
    };
    let nb = st.add_buffer(Buffer {
        name: format!("{}_{scope}", old.name),
        shape,
        dtype: old.dtype,
        scope: scope.to_string(),
    });
    let root = st.root;
    st.blocks[root].block.alloc_buffers.push(nb);
    nb
}

pub fn cache_write(st: &mut State, b: BlockId, index: i64, scope: &str) -> Result<BlockId> {
    const I: &str = "CacheWrite";
    if b == st.root || !st.blocks[b].alive {
        return Err(Error::schedule(
            I,
            "the block is the root or no longer exists",
        ));
    }
    let acc = usize::try_from(index)
        .ok()
        .and_then(|i| st.blocks[b].block.writes.get(i))
        .cloned()
        .ok_or_else(|| Error::schedule(I, format!("write buffer index {index} out of range")))?;
    let consumers = st.consumers(b);
    // The stage goes right before the first consumer found from the block upward, and covers
    // what the block writes under that loop.
    let (parent, pos) = cache_location(st, b, &consumers);
    let region = relaxed_region(st, I, b, &acc, parent)?;
    let buffer = acc.buffer;
    let nb = new_cache_buffer(st, buffer, scope, parent.is_none(), &region);
    retarget(&mut st.blocks[b].block, buffer, nb, true, true);
    let name = format!("{}_{scope}", st.buffers[buffer].name);
    let (blk, node) = copy_stage(st, name, nb, buffer, &region);
    st.insert(parent, pos, node);
    Ok(blk)
}

pub fn cache_read(
    st: &mut State,
    b: BlockId,
    index: i64,
    scope: &str,
    consumers: &[BlockId],
) -> Result<BlockId> {
    const I: &str = "CacheRead";
    if b == st.root || !st.blocks[b].alive {
        return Err(Error::schedule(
            I,
            "the block is the root or no longer exists",
        ));
    }
    let acc = usize::try_from(index)
        .ok()
        .and_then(|i| st.blocks[b].block.reads.get(i))
        .cloned()
        .ok_or_else(|| Error::schedule(I, format!("read buffer index {index} out of range")))?;
    let buffer = acc.buffer;
    let readers: Vec<BlockId> = if consumers.is_empty() {
        st.all_blocks()
            .into_iter()
            .filter(|&x| st.blocks[x].block.reads.iter().any(|a| a.buffer == buffer))
            .collect()
    } else {
        consumers.to_vec()
    };
    let writer = st
        .all_blocks()
        .into_iter()
        .find(|&x| st.blocks[x].block.writes.iter().any(|a| a.buffer == buffer));
    // As TVM: with a writer block, the stage goes right before the first reader found from the
    // writer upward and covers what the writer writes under that loop; an input buffer is
    // copied whole, first in the function.
    let (parent, pos) = match writer {
        Some(w) => cache_location(st, w, &readers),
        None => (None, 0),
    };
    let region = match writer {
        Some(w) => {
            let acc = st.blocks[w]
                .block
                .writes
                .iter()
                .find(|a| a.buffer == buffer)
                .cloned()
                .ok_or_else(|| Error::Internal("cache_read: writer without the write".into()))?;
            relaxed_region(st, I, w, &acc, parent)?
        }
        None => st.buffers[buffer]
            .shape
            .iter()
            .map(|&d| (Lin::constant(0), 0, d))
            .collect(),
    };
    let nb = new_cache_buffer(st, buffer, scope, parent.is_none(), &region);
    for &r in &readers {
        retarget(&mut st.blocks[r].block, buffer, nb, true, false);
    }
    let name = format!("{}_{scope}", st.buffers[buffer].name);
    let (blk, node) = copy_stage(st, name, buffer, nb, &region);
    st.insert(parent, pos, node);
    Ok(blk)
}

/// `set_scope`: the buffer `b` writes at `index` moves to storage `scope`, renamed
/// `<name>_<scope>` as TVM renames it. Like TVM, a buffer already in `scope` is left alone, and
/// only a buffer the function allocates can move; its accesses are unchanged.
pub fn set_scope(st: &mut State, b: BlockId, index: i64, scope: &str) -> Result<()> {
    const K: &str = "SetScope";
    let writes = &st.blocks[b].block.writes;
    let buffer = usize::try_from(index)
        .ok()
        .and_then(|i| writes.get(i))
        .map(|a| a.buffer)
        .ok_or_else(|| {
            Error::schedule(
                K,
                format!(
                    "block {} has no write buffer {index}",
                    st.blocks[b].block.name
                ),
            )
        })?;
    if st.buffers[buffer].scope == scope {
        return Ok(());
    }
    if st.is_param(buffer) {
        return Err(Error::schedule(
            K,
            format!(
                "buffer {} is a function parameter, not an allocation",
                st.buffers[buffer].name
            ),
        ));
    }
    let known = ["global", "shared", "shared.dyn", "local", "warp"];
    if !known.contains(&scope) {
        return Err(Error::schedule(
            K,
            format!("unsupported storage scope {scope:?}"),
        ));
    }
    let moved = &mut st.buffers[buffer];
    moved.name = format!("{}_{scope}", moved.name);
    moved.scope = scope.to_string();
    Ok(())
}
