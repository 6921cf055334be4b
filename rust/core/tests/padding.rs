//! Padding (a conditional block) is inlined into its convolution, a pass of its own at the root,
//! or computed under the convolution's tiles; all three are drawn, replay in the schedule
//! engine, are reached by mutation, and the analytical model sees what each costs.

use std::collections::BTreeMap;

use fastsearch_core::apply_trace;
use fastsearch_core::estimate_cycles;
use fastsearch_core::Program;
use fastsearch_core::Rng;
use fastsearch_core::{emit, mutate, CpuTarget, Genome, Rule, SketchSpace, WriteCache};

fn cbr() -> (String, Program) {
    let path = format!(
        "{}/tests/fixtures/cbr_small.json",
        env!("CARGO_MANIFEST_DIR")
    );
    let text = std::fs::read_to_string(path).unwrap();
    let program = Program::from_json(&text).unwrap();
    (text, program)
}

fn block(p: &Program, name: &str) -> usize {
    p.block_by_name(name).unwrap()
}

#[test]
fn padding_is_drawn_inlined_at_the_root_and_under_the_tiles_and_all_replay() {
    let (text, p) = cbr();
    let space = SketchSpace::new(&p);
    let target = CpuTarget::new(2);
    let (pad, conv) = (block(&p, "PaddedInput"), block(&p, "Conv2dOutput"));
    assert!(space.optional_inline.contains(&pad));
    assert!(!space.inlined.contains(&pad));
    let (mut inlined, mut root, mut under_tiles) = (0, 0, 0);
    for i in 0..200 {
        let g = space.draw(&p, &target, &mut Rng::derive(11, i));
        match &g.rules[&pad] {
            Rule::Inline => inlined += 1,
            Rule::Root => root += 1,
            Rule::ComputeAt { host, depth } => {
                assert_eq!(*host, conv);
                assert!(matches!(g.rules[&conv], Rule::Tile { .. }));
                assert!(*depth < space.tiled_location_depths(&p, conv));
                under_tiles += 1;
            }
            other => panic!("padding drawn as {other:?}"),
        }
        let trace = emit(&p, &space, &g).to_string();
        apply_trace(&text, &trace, true).unwrap_or_else(|e| panic!("{e}: {trace}"));
    }
    // Drawn with odds 0.4 / 0.2 / 0.4 (PADDING_INLINE_PROB, PADDING_ROOT_PROB).
    assert!(
        inlined > 55 && root > 20 && under_tiles > 55,
        "{inlined} / {root} / {under_tiles}"
    );
}

#[test]
fn mutation_moves_padding_between_inlined_and_computed() {
    let (text, p) = cbr();
    let space = SketchSpace::new(&p);
    let target = CpuTarget::new(2);
    let pad = block(&p, "PaddedInput");
    let mut seen = std::collections::HashSet::new();
    let mut g = space.draw(&p, &target, &mut Rng::new(5));
    for i in 0..2000 {
        g = mutate(&g, &p, &space, &mut Rng::derive(6, i));
        seen.insert(std::mem::discriminant(&g.rules[&pad]));
        let trace = emit(&p, &space, &g).to_string();
        apply_trace(&text, &trace, true).unwrap_or_else(|e| panic!("{e}: {trace}"));
    }
    assert_eq!(
        seen.len(),
        3,
        "mutation never reached one of the padding's placements"
    );
}

/// One tiling of the 8x8x4 -> 8x8x8 convolution (n, h, w, co; rh, rw, rc) with padding `pad_rule`.
fn genome(p: &Program, pad_rule: Rule) -> Genome {
    let (pad, conv) = (block(p, "PaddedInput"), block(p, "Conv2dOutput"));
    let mut rules = BTreeMap::new();
    for b in ["bias_add", "bn_mul", "bn_add"] {
        rules.insert(block(p, b), Rule::Inline);
    }
    rules.insert(block(p, "compute"), Rule::Root);
    rules.insert(pad, pad_rule);
    rules.insert(
        conv,
        Rule::Tile {
            cache: WriteCache::Global,
            level: 1,
        },
    );
    let s = |f: [i64; 4]| f.to_vec();
    let r = |f: [i64; 2]| f.to_vec();
    let tiles = vec![
        s([1, 1, 1, 1]),
        s([2, 2, 1, 2]),
        s([2, 2, 1, 2]),
        s([1, 1, 1, 8]),
        r([3, 1]),
        r([3, 1]),
        r([1, 4]),
    ];
    let mut all = BTreeMap::new();
    all.insert(conv, tiles);
    Genome {
        rules,
        tiles: all,
        parallel: 32,
        vectorize: 64,
        unroll: 1,
    }
}

#[test]
fn the_model_prices_where_the_padding_goes() {
    let (text, p) = cbr();
    let space = SketchSpace::new(&p);
    let target = CpuTarget::new(2).with_vector_bytes(64);
    let conv = block(&p, "Conv2dOutput");
    let cost = |rule: Rule| {
        let g = genome(&p, rule);
        apply_trace(&text, &emit(&p, &space, &g).to_string(), true).unwrap();
        estimate_cycles(&p, &space, &g, &target)
    };
    let at = |depth| Rule::ComputeAt { host: conv, depth };
    // Under the outermost loop (n, extent 1), the parallel loops end there: one core.
    assert!(cost(at(0)) > 1.5 * cost(at(4)));
    // Under S1's last loop the padding is computed once per tile, halos included, and the
    // convolution reads plain values: cheaper than a select in its inner loops.
    assert!(cost(at(7)) < cost(Rule::Inline));
    // Under R0 (rh, rw, rc) it is computed again for every reduction step of every tile.
    assert!(cost(at(7)) < cost(at(10)));
    // At the root it is one more pass over the padded input, cheaper than recomputing it
    // under R0; on this small input the pass stays in L2 and costs less than the select.
    assert!(cost(Rule::Root) < cost(at(10)));
    assert!(cost(Rule::Root) < cost(Rule::Inline));
}

#[test]
fn a_convolution_fuses_its_epilogue_into_its_tiles() {
    // The epilogue (bias, activation) follows the convolution in program order, and rules are
    // drawn consumers first: it must still be left for the convolution to fuse.
    let (text, p) = cbr();
    let space = SketchSpace::new(&p);
    let target = CpuTarget::new(2);
    let conv = block(&p, "Conv2dOutput");
    let mut fused = 0;
    for i in 0..200 {
        let g = space.draw(&p, &target, &mut Rng::derive(5, i));
        if let Rule::Tile {
            cache: WriteCache::FusedConsumer(c),
            ..
        } = &g.rules[&conv]
        {
            assert!(!space.inlined.contains(c));
            assert!(matches!(g.rules.get(c), Some(Rule::Root) | None));
            fused += 1;
            let trace = emit(&p, &space, &g).to_string();
            apply_trace(&text, &trace, true).unwrap_or_else(|e| panic!("{e}: {trace}"));
        }
    }
    // One of three write-cache choices at each tiling level.
    assert!(fused > 40, "{fused} of 200 draws fuse the epilogue");
}

#[test]
fn mutation_moves_a_tile_into_and_out_of_its_fused_epilogue() {
    // Evolution starts from whatever the first batches measured best: a population without a
    // fused epilogue must still reach one (and one with it leave it), each result replaying.
    let (text, p) = cbr();
    let space = SketchSpace::new(&p);
    let target = CpuTarget::new(2);
    let conv = block(&p, "Conv2dOutput");
    let unfused = (0..200)
        .map(|i| space.draw(&p, &target, &mut Rng::derive(7, i)))
        .find(|g| {
            matches!(
                g.rules[&conv],
                Rule::Tile {
                    cache: WriteCache::None,
                    ..
                }
            )
        })
        .expect("an unfused draw");
    let (mut into, mut out_of) = (0, 0);
    for i in 0..400 {
        let g = mutate(&unfused, &p, &space, &mut Rng::derive(8, i));
        let Rule::Tile {
            cache: WriteCache::FusedConsumer(c),
            ..
        } = g.rules[&conv]
        else {
            continue;
        };
        into += 1;
        assert!(matches!(g.rules.get(&c), Some(Rule::Root) | None));
        let trace = emit(&p, &space, &g).to_string();
        apply_trace(&text, &trace, true).unwrap_or_else(|e| panic!("{e}: {trace}"));
        for j in 0..50 {
            let back = mutate(&g, &p, &space, &mut Rng::derive(9, j));
            if matches!(
                back.rules[&conv],
                Rule::Tile {
                    cache: WriteCache::None | WriteCache::Global,
                    ..
                }
            ) {
                out_of += 1;
                let trace = emit(&p, &space, &back).to_string();
                apply_trace(&text, &trace, true).unwrap_or_else(|e| panic!("{e}: {trace}"));
            }
        }
    }
    assert!(into > 5, "{into} of 400 mutations fuse the epilogue");
    assert!(out_of > 0, "no mutation leaves the fused epilogue");
}
