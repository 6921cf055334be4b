//! Carrying a candidate over to another shape of the same operator, for warm starts.
//!
//! A genome found on one shape keeps its structure (the rule of each block), its annotations and
//! as much of its tiling as the new extents allow: each loop's factors are refitted from the
//! innermost level outwards (the levels that size register and cache tiles, which is what
//! carries over between shapes), each to the divisor of what is left nearest to the old factor
//! in ratio; the outermost level takes the rest. A genome whose blocks do not match the program,
//! or whose trace the schedule engine refuses there, does not carry over.
//!
//! [`transfer_from_sibling`] carries a genome between two programs whose blocks differ: the same
//! convolution fused with another epilogue (ResNet's block with and without the residual add).
//! Blocks are matched by name; a block only the source has must have been inlined there, and a
//! block only the target has must be one every candidate inlines.

use std::collections::{BTreeMap, HashMap};

use super::{
    emit, Genome, Partial, Rule, SketchSpace, WriteCache, MAX_INNERMOST_FACTOR, UNROLL_CANDIDATES,
};
use crate::program::{IterKind, Program};
use crate::schedule::{trace, State, Trace};

/// Factors of `extent`, as many as `old` has, each close to the factor of `old` at its level.
/// The innermost factor stays at most `max_innermost` (when `extent` allows it, as it always
/// does: 1 divides everything). The product is always `extent`.
pub fn refit_factors(old: &[i64], extent: i64, max_innermost: i64) -> Vec<i64> {
    let parts = old.len().max(1);
    let mut out = vec![1i64; parts];
    let mut rest = extent.max(1);
    for level in (1..parts).rev() {
        let cap = if level == parts - 1 {
            max_innermost.max(1)
        } else {
            i64::MAX
        };
        let want = old.get(level).copied().unwrap_or(1).max(1) as f64;
        let d = divisors(rest)
            .into_iter()
            .filter(|d| *d <= cap)
            .min_by(|a, b| {
                let da = ((*a as f64) / want).ln().abs();
                let db = ((*b as f64) / want).ln().abs();
                // Ties go to the smaller factor: it leaves more to the outer, parallel levels.
                da.total_cmp(&db).then(a.cmp(b))
            })
            .unwrap_or(1);
        out[level] = d;
        rest /= d;
    }
    out[0] = rest;
    out
}

fn divisors(n: i64) -> Vec<i64> {
    let mut small = Vec::new();
    let mut large = Vec::new();
    let mut d = 1;
    while d * d <= n {
        if n % d == 0 {
            small.push(d);
            if d * d != n {
                large.push(n / d);
            }
        }
        d += 1;
    }
    small.extend(large.into_iter().rev());
    small
}

/// `genome` (found on another shape of the same operator) refitted to `program`, or `None` when
/// its blocks and rules do not fit `program` or the schedule engine refuses the result.
pub fn transfer(program: &Program, space: &SketchSpace, genome: &Genome) -> Option<Genome> {
    let n_blocks = program.blocks.len();
    let known = |b: usize| space.infos.iter().any(|i| i.block == b);
    if genome.unroll >= UNROLL_CANDIDATES.len() || genome.parallel < 1 || genome.vectorize < 1 {
        return None;
    }
    for (&block, rule) in &genome.rules {
        if !known(block) {
            return None;
        }
        let inline_fits = if space.optional_inline.contains(&block) {
            matches!(rule, Rule::Inline | Rule::Root | Rule::ComputeAt { .. })
        } else {
            space.inlined.contains(&block) == (*rule == Rule::Inline)
        };
        if !inline_fits {
            return None;
        }
        let info = space.info(block);
        let fits = match rule {
            Rule::Tile { cache, level } => {
                info.simple_loops
                    && *level <= 1
                    && match cache {
                        WriteCache::FusedConsumer(c) => known(*c),
                        _ => true,
                    }
            }
            Rule::RFactor { .. } => info.simple_loops && space.rfactor_applies(program, info),
            Rule::ComputeAt { .. } | Rule::Inline | Rule::Root => true,
        } && rule.location().is_none_or(|(host, depth)| {
            known(host) && depth < space.host_loop_count(program, &genome.rules, host)
        }) && match rule {
            // Partial results under a loop above the final reduction's.
            Rule::RFactor {
                at,
                partial: partial @ Partial::At(_),
                ..
            } => at.is_some_and(|(_, depth)| partial.fits_above(depth)),
            _ => true,
        };
        if !fits {
            return None;
        }
    }
    if space
        .inlined
        .iter()
        .chain(&space.optional_inline)
        .any(|b| !genome.rules.contains_key(b))
    {
        return None;
    }
    let mut tiles = BTreeMap::new();
    for (&block, loops) in &genome.tiles {
        if block >= n_blocks {
            return None;
        }
        let info = space.info(block);
        let refitted: Vec<Vec<i64>> = match genome.rules.get(&block)? {
            Rule::Tile { .. } => {
                let vars = &program.blocks[block].iter_vars;
                if loops.len() != vars.len() || info.loop_extents.len() != vars.len() {
                    return None;
                }
                let mut out = Vec::with_capacity(loops.len());
                for ((old, var), extent) in loops.iter().zip(vars).zip(&info.loop_extents) {
                    let parts = if var.kind == IterKind::Reduce { 2 } else { 4 };
                    if old.len() != parts {
                        return None;
                    }
                    out.push(refit_factors(old, *extent, MAX_INNERMOST_FACTOR));
                }
                out
            }
            Rule::RFactor { .. } => match loops.as_slice() {
                [old] if old.len() == 2 => {
                    vec![refit_factors(old, info.reduce_extent, MAX_INNERMOST_FACTOR)]
                }
                _ => return None,
            },
            _ => return None,
        };
        tiles.insert(block, refitted);
    }
    let out = Genome {
        rules: genome.rules.clone(),
        tiles,
        ..genome.clone()
    };
    // The rules were legal on the other shape; the engine says whether they are here.
    let text = emit(program, space, &out).to_string();
    let replayed = Trace::from_json(&text).and_then(|t| {
        let mut st = State::from_program(program)?;
        trace::apply_trace(&mut st, &t, true)
    });
    replayed.ok().map(|_| out)
}

/// `genome`, found on `source`, carried over to `program` (see the module's documentation), or
/// `None` when a block it schedules has no namesake in `program`, `program` has a block of its
/// own that candidates do not always inline, or [`transfer`] refuses the result.
pub fn transfer_from_sibling(
    source: &Program,
    program: &Program,
    space: &SketchSpace,
    genome: &Genome,
) -> Option<Genome> {
    let index: HashMap<&str, usize> = program
        .blocks
        .iter()
        .enumerate()
        .map(|(i, b)| (b.name.as_str(), i))
        .collect();
    let map =
        |b: usize| -> Option<usize> { index.get(source.blocks.get(b)?.name.as_str()).copied() };
    let mut rules = BTreeMap::new();
    for (&block, rule) in &genome.rules {
        let Some(to) = map(block) else {
            if *rule == Rule::Inline {
                continue; // an epilogue block the target does not have
            }
            return None;
        };
        let moved = match rule {
            Rule::ComputeAt { host, depth } => Rule::ComputeAt {
                host: map(*host)?,
                depth: *depth,
            },
            Rule::RFactor {
                outer,
                at: Some((host, depth)),
                partial,
            } => Rule::RFactor {
                outer: *outer,
                at: Some((map(*host)?, *depth)),
                partial: *partial,
            },
            Rule::Tile {
                cache: WriteCache::FusedConsumer(c),
                level,
            } => Rule::Tile {
                cache: WriteCache::FusedConsumer(map(*c)?),
                level: *level,
            },
            other => other.clone(),
        };
        rules.insert(to, moved);
    }
    for &block in &space.inlined {
        rules.entry(block).or_insert(Rule::Inline);
    }
    let mut tiles = BTreeMap::new();
    for (&block, loops) in &genome.tiles {
        tiles.insert(map(block)?, loops.clone());
    }
    let moved = Genome {
        rules,
        tiles,
        ..genome.clone()
    };
    transfer(program, space, &moved)
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    #[test]
    fn inner_factors_carry_over() {
        // 512 = [2, 8, 4, 8] on a 1024 loop: inner levels kept, the outer one grows.
        assert_eq!(refit_factors(&[2, 8, 4, 8], 1024, 64), vec![4, 8, 4, 8]);
        // 56 has no factor 16: the nearest in ratio (14) stands in.
        assert_eq!(refit_factors(&[1, 2, 4, 16], 56, 64), vec![1, 1, 4, 14]);
        assert_eq!(refit_factors(&[7], 49, 64), vec![49]);
    }

    proptest! {
        #[test]
        fn refitted_tilings_are_perfect(
            old in proptest::collection::vec(1i64..100, 1..5),
            extent in 1i64..20_000,
        ) {
            let f = refit_factors(&old, extent, 64);
            prop_assert_eq!(f.len(), old.len());
            prop_assert_eq!(f.iter().product::<i64>(), extent);
            prop_assert!(f.len() == 1 || f[f.len() - 1] <= 64);
            prop_assert!(f.iter().all(|x| *x >= 1));
        }
    }
}
