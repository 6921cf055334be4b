//! The searches on real programs (fixtures exported from TVM by `fastsearch.tir_import`),
//! scored by a synthetic model whose optimum is known.

use std::collections::{HashMap, HashSet};

use fastsearch_core::Program;
use fastsearch_core::Rng;
use fastsearch_core::{anneal, AnnealingConfig};
use fastsearch_core::{coarse_shape, reduction_split, structure, Proposal, Role, SearchContext};
use fastsearch_core::{evolve, EvolutionConfig};
use fastsearch_core::{CpuTarget, Genome, Rule, SketchSpace};

/// A program with its sketches, a 2-core target and the measured candidates.
struct Fixture {
    program: Program,
    space: SketchSpace,
    target: CpuTarget,
    measured: HashMap<String, f64>,
}

impl Fixture {
    fn new(name: &str) -> Fixture {
        let path = format!("{}/tests/fixtures/{name}.json", env!("CARGO_MANIFEST_DIR"));
        let program = Program::from_json(&std::fs::read_to_string(path).unwrap()).unwrap();
        let space = SketchSpace::new(&program);
        Fixture {
            program,
            space,
            target: CpuTarget::new(2),
            measured: HashMap::new(),
        }
    }

    fn ctx(&self) -> SearchContext<'_> {
        SearchContext {
            program: &self.program,
            space: &self.space,
            target: &self.target,
            measured: &self.measured,
        }
    }

    fn random(&self, n: u64, seed: u64) -> Vec<Genome> {
        (0..n)
            .map(|i| {
                self.space
                    .draw(&self.program, &self.target, &mut Rng::derive(seed, i))
            })
            .collect()
    }

    fn mean_score(&self, genomes: &[Genome]) -> f64 {
        let s = synthetic(&self.program, &self.space, genomes);
        s.iter().sum::<f64>() / s.len() as f64
    }
}

/// Prefers innermost tiles of 16 and middle tiles of 4 on every loop of tiled blocks.
fn synthetic(_: &Program, _: &SketchSpace, genomes: &[Genome]) -> Vec<f64> {
    genomes
        .iter()
        .map(|g| {
            let mut s = 0.0;
            for (block, tiles) in &g.tiles {
                if !matches!(g.rules[block], Rule::Tile { .. }) {
                    continue;
                }
                for t in tiles {
                    let last = *t.last().unwrap() as f64;
                    s -= (last.log2() - 4.0).abs();
                    if t.len() == 4 {
                        s -= ((t[2] as f64).log2() - 2.0).abs();
                    }
                }
            }
            s
        })
        .collect()
}

fn genomes(proposals: &[Proposal]) -> Vec<Genome> {
    proposals.iter().map(|x| x.genome.clone()).collect()
}

#[test]
fn evolution_beats_random_draws_and_skips_measured() {
    let mut f = Fixture::new("gmm_512");
    let config = EvolutionConfig {
        population: 256,
        generations: 4,
        epsilon: 0.0,
        ..Default::default()
    };
    let best = evolve(&f.ctx(), &synthetic, &[], 16, &config, 7);
    assert_eq!(best.len(), 16);
    let (e, r) = (
        f.mean_score(&genomes(&best)),
        f.mean_score(&f.random(256, 99)),
    );
    assert!(e > r + 1.0, "evolved mean score {e} not above random {r}");

    // Measured candidates are never proposed again.
    f.measured = best.iter().take(8).map(|x| (x.key.clone(), 1.0)).collect();
    let again = evolve(&f.ctx(), &synthetic, &[], 16, &config, 7);
    assert!(again.iter().all(|x| !f.measured.contains_key(&x.key)));
}

#[test]
fn search_is_the_same_on_one_or_many_threads() {
    let f = Fixture::new("cbr_small");
    let config = EvolutionConfig {
        population: 128,
        generations: 3,
        ..Default::default()
    };
    let annealing = AnnealingConfig {
        chains: 64,
        steps: 8,
        start_temperature: 1.0,
    };
    let run = |threads: usize| {
        let pool = rayon::ThreadPoolBuilder::new()
            .num_threads(threads)
            .build()
            .unwrap();
        pool.install(|| {
            let keys = |p: Vec<Proposal>| p.into_iter().map(|x| x.key).collect::<Vec<_>>();
            (
                keys(evolve(&f.ctx(), &synthetic, &[], 12, &config, 3)),
                keys(anneal(&f.ctx(), &synthetic, &[], 12, &annealing, 3)),
            )
        })
    };
    assert_eq!(run(1), run(4));
}

#[test]
fn annealing_improves_on_its_start() {
    let f = Fixture::new("gmm_512");
    let config = AnnealingConfig {
        chains: 64,
        steps: 32,
        start_temperature: 0.5,
    };
    let out = anneal(&f.ctx(), &synthetic, &[], 8, &config, 5);
    assert!(f.mean_score(&genomes(&out)) > f.mean_score(&f.random(64, 5)) + 1.0);
}

#[test]
fn small_spaces_still_fill_the_batch() {
    let f = Fixture::new("sfm_small");
    let out = evolve(
        &f.ctx(),
        &synthetic,
        &[],
        8,
        &EvolutionConfig {
            population: 64,
            ..Default::default()
        },
        1,
    );
    assert_eq!(out.len(), 8);
}

/// Distinct coarse shapes among `proposals` that no `measured` genome has.
fn novel_shapes(proposals: &[Proposal], measured: &[Genome]) -> usize {
    let old: HashSet<u64> = measured.iter().map(coarse_shape).collect();
    proposals
        .iter()
        .map(|p| coarse_shape(&p.genome))
        .filter(|s| !old.contains(s))
        .collect::<HashSet<u64>>()
        .len()
}

/// A fixture whose run has measured 16 candidates (the first batch of a search without any
/// exploring share, which it returns), and their genomes.
fn sixteen_measured(name: &str) -> (Fixture, EvolutionConfig, Vec<Genome>) {
    let mut f = Fixture::new(name);
    let focused = EvolutionConfig {
        population: 256,
        generations: 3,
        epsilon: 0.0,
        novel_share: 0.0,
        structure_share: 0.0,
        ..Default::default()
    };
    let first = evolve(&f.ctx(), &synthetic, &[], 16, &focused, 7);
    f.measured = first.iter().map(|x| (x.key.clone(), 1.0)).collect();
    let seeds = genomes(&first);
    (f, focused, seeds)
}

#[test]
fn late_batches_spend_their_share_on_shapes_not_measured() {
    let (f, focused, seeds) = sixteen_measured("gmm_512");
    let exploring = EvolutionConfig {
        novel_share: 0.5,
        novel_after: 16,
        ..focused.clone()
    };

    let plain = evolve(&f.ctx(), &synthetic, &seeds, 16, &focused, 8);
    let novel = evolve(&f.ctx(), &synthetic, &seeds, 16, &exploring, 8);
    assert_eq!(novel.len(), 16);
    assert!(novel.iter().all(|x| !f.measured.contains_key(&x.key)));
    // Half the batch: eight shapes the run has not measured, one candidate each.
    assert!(novel_shapes(&novel, &seeds) >= 8);
    assert!(novel_shapes(&novel, &seeds) > novel_shapes(&plain, &seeds));

    // Below `novel_after` measured candidates the batch is the plain one.
    let early = EvolutionConfig {
        novel_after: 17,
        ..exploring
    };
    let keys = |p: &[Proposal]| p.iter().map(|x| x.key.clone()).collect::<Vec<_>>();
    assert_eq!(
        keys(&evolve(&f.ctx(), &synthetic, &seeds, 16, &early, 8)),
        keys(&plain)
    );
}

#[test]
fn late_batches_spend_their_share_on_reduction_splits_measured_least() {
    let (f, focused, seeds) = sixteen_measured("gmm_512");
    let exploring = EvolutionConfig {
        reduction_share: 0.25,
        structure_tries: 2,
        novel_after: 16,
        ..focused.clone()
    };
    let mut counts: HashMap<u64, usize> = HashMap::new();
    for g in &seeds {
        *counts.entry(reduction_split(g)).or_insert(0) += 1;
    }
    let rare = |p: &[Proposal]| {
        p.iter()
            .filter(|x| x.role == Role::Reduction)
            .map(|x| reduction_split(&x.genome))
            .filter(|s| counts.get(s).copied().unwrap_or(0) < 2)
            .collect::<HashSet<u64>>()
            .len()
    };
    let plain = evolve(&f.ctx(), &synthetic, &seeds, 16, &focused, 8);
    let exploring_batch = evolve(&f.ctx(), &synthetic, &seeds, 16, &exploring, 8);
    assert_eq!(exploring_batch.len(), 16);
    assert!(plain.iter().all(|x| x.role != Role::Reduction));
    // A quarter of the batch: four reduction splits measured fewer than twice, one each.
    assert_eq!(rare(&exploring_batch), 4);
}

#[test]
fn late_batches_spend_their_share_on_structures_measured_least() {
    let (f, focused, seeds) = sixteen_measured("cbr_small");
    let exploring = EvolutionConfig {
        structure_share: 0.25,
        structure_tries: 2,
        novel_after: 16,
        ..focused.clone()
    };
    let mut counts: HashMap<u64, usize> = HashMap::new();
    for g in &seeds {
        *counts.entry(structure(g)).or_insert(0) += 1;
    }
    let rare = |p: &[Proposal]| {
        p.iter()
            .map(|x| structure(&x.genome))
            .filter(|s| counts.get(s).copied().unwrap_or(0) < 2)
            .collect::<HashSet<u64>>()
            .len()
    };

    // A model sure of the structure measured most, as late in a run: without the share the
    // whole batch goes to it.
    let favourite = *counts.iter().max_by_key(|(s, c)| (**c, **s)).unwrap().0;
    let sure = |p: &Program, space: &SketchSpace, g: &[Genome]| -> Vec<f64> {
        let base = synthetic(p, space, g);
        g.iter()
            .zip(base)
            .map(|(g, s)| {
                if structure(g) == favourite {
                    s + 100.0
                } else {
                    s
                }
            })
            .collect()
    };
    let plain = evolve(&f.ctx(), &sure, &seeds, 16, &focused, 8);
    let tried = evolve(&f.ctx(), &sure, &seeds, 16, &exploring, 8);
    assert_eq!(tried.len(), 16);
    assert!(tried.iter().all(|x| !f.measured.contains_key(&x.key)));
    // A quarter of the batch: four structures measured fewer than twice, one candidate each.
    let picks: Vec<&Proposal> = tried.iter().filter(|x| x.role == Role::Structure).collect();
    assert_eq!(picks.len(), 4);
    let structures: HashSet<u64> = picks.iter().map(|x| structure(&x.genome)).collect();
    assert_eq!(structures.len(), 4);
    assert!(structures
        .iter()
        .all(|s| counts.get(s).copied().unwrap_or(0) < 2));
    assert_eq!(rare(&plain), 0);
    assert_eq!(rare(&tried), 4);
    assert!(plain.iter().all(|x| x.role == Role::Exploit));

    // Below `novel_after` measured candidates the batch is the plain one.
    let early = EvolutionConfig {
        novel_after: 17,
        ..exploring
    };
    let keys = |p: &[Proposal]| p.iter().map(|x| x.key.clone()).collect::<Vec<_>>();
    assert_eq!(
        keys(&evolve(&f.ctx(), &sure, &seeds, 16, &early, 8)),
        keys(&plain)
    );
}
