//! Carrying a genome to a sibling program (blocks matched by name): a program is its own
//! sibling, and a program with other blocks takes nothing.

use fastsearch_core::Program;
use fastsearch_core::Rng;
use fastsearch_core::{transfer, transfer_from_sibling, CpuTarget, SketchSpace};

fn fixture(name: &str) -> Program {
    let path = format!("{}/tests/fixtures/{name}", env!("CARGO_MANIFEST_DIR"));
    Program::from_json(&std::fs::read_to_string(path).unwrap()).unwrap()
}

#[test]
fn a_program_is_its_own_sibling() {
    let p = fixture("cbr_small.json");
    let space = SketchSpace::new(&p);
    let target = CpuTarget::new(2);
    let mut carried = 0;
    for i in 0..100 {
        let g = space.draw(&p, &target, &mut Rng::derive(5, i));
        let moved = transfer_from_sibling(&p, &p, &space, &g);
        assert_eq!(moved, transfer(&p, &space, &g));
        carried += usize::from(moved == Some(g));
    }
    assert!(
        carried >= 90,
        "only {carried} of 100 genomes carried over unchanged"
    );
}

#[test]
fn blocks_without_namesakes_do_not_carry_over() {
    let (cbr, gmm) = (fixture("cbr_small.json"), fixture("gmm_512.json"));
    let (cbr_space, gmm_space) = (SketchSpace::new(&cbr), SketchSpace::new(&gmm));
    let target = CpuTarget::new(2);
    for i in 0..50 {
        let g = cbr_space.draw(&cbr, &target, &mut Rng::derive(6, i));
        assert_eq!(transfer_from_sibling(&cbr, &gmm, &gmm_space, &g), None);
        let g = gmm_space.draw(&gmm, &target, &mut Rng::derive(7, i));
        assert_eq!(transfer_from_sibling(&gmm, &cbr, &cbr_space, &g), None);
    }
}
