//! The "loop nest" description of a schedule state: what the differential test compares with
//! TVM (loop order, extents, kinds, annotations, block placement, allocated buffers). Loop
//! variable names are left out: they are naming noise.

use serde_json::{json, Map, Value};

use super::state::{Child, State};

fn annotations(m: &std::collections::BTreeMap<String, Value>) -> Value {
    Value::Object(
        m.iter()
            .map(|(k, v)| (k.clone(), v.clone()))
            .collect::<Map<_, _>>(),
    )
}

fn node(st: &State, c: Child) -> Value {
    match c {
        Child::Loop(l) => {
            let lp = &st.loops[l];
            json!({
                "loop": {
                    "extent": lp.extent,
                    "kind": lp.kind.name(),
                    "thread": lp.thread,
                    "annotations": annotations(&lp.annotations),
                    "body": lp.children.iter().map(|&k| node(st, k)).collect::<Vec<_>>(),
                }
            })
        }
        Child::Block(b) => {
            let blk = &st.blocks[b].block;
            json!({ "block": { "name": blk.name, "annotations": annotations(&blk.annotations) } })
        }
    }
}

pub fn loop_nest(st: &State) -> Value {
    let root = &st.blocks[st.root].block;
    let buffers: Vec<Value> = root
        .alloc_buffers
        .iter()
        .map(|&i| {
            let b = &st.buffers[i];
            json!({ "name": b.name, "shape": b.shape, "dtype": b.dtype, "scope": b.scope })
        })
        .collect();
    json!({
        "root_annotations": annotations(&root.annotations),
        "buffers": buffers,
        "body": st.top.iter().map(|&c| node(st, c)).collect::<Vec<_>>(),
    })
}
