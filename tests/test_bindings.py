"""The extension's handles: a Program parsed once and used many times, keyword-only options,
clear errors, and a call that Ctrl-C interrupts."""

import signal
import subprocess
import sys
import textwrap

import pytest
from fastsearch import _core
from fastsearch.errors import MalformedInput, UnsupportedWorkload
from fastsearch.ir.tir_import import program_json
from workloads import matmul

CPU = _core.Target(2, vector_bytes=64)


def test_a_program_handle_gives_what_a_fresh_one_gives():
    text = program_json(matmul(32))
    program = _core.Program(text)
    first = program.sample_genomes(CPU, 16, 7)
    again = program.sample_genomes(CPU, 16, 7)  # the sketch space is built once, then reused
    assert first == again == _core.Program(text).sample_genomes(CPU, 16, 7)
    genomes = [g for _, g in first]
    assert program.analytical_scores(CPU, genomes) == _core.Program(text).analytical_scores(CPU, genomes)
    proposals = program.propose(CPU, strategy="annealing", n=4, seed=1, measured={}, seeds=genomes[:2])
    assert len(proposals) == 4 and {role for *_, role in proposals} <= {
        "exploit",
        "shape",
        "structure",
        "reduction",
        "random",
    }


def test_options_are_keywords_and_bad_values_are_clear():
    program = _core.Program(program_json(matmul(16)))
    with pytest.raises(TypeError):
        program.propose(CPU, "evolutionary", 4, 0, {}, [])  # type: ignore[misc]
    with pytest.raises(MalformedInput, match="unknown search strategy `greedy`"):
        program.propose(CPU, strategy="greedy", n=4, seed=0, measured={}, seeds=[])  # type: ignore[arg-type]
    with pytest.raises(MalformedInput, match="genome JSON"):
        program.analytical_scores(CPU, ["{not a genome"])
    with pytest.raises(MalformedInput):
        _core.Program("not json")
    with pytest.raises((MalformedInput, UnsupportedWorkload)):
        _core.Program('{"buffers": 3}')


def test_target_holds_the_clamped_cpu_facts():
    t = _core.Target(4, vector_bytes=64, fma_per_cycle=1.0, parallel_speedup=9.0)
    assert (t.num_cores, t.vector_bytes, t.fma_per_cycle, t.parallel_speedup) == (4, 64, 1.0, 4.0)
    assert _core.Target(2).parallel_speedup == 2.0  # linear by default
    # x86-64's vector registers for the width (AVX-512: 32, AVX2: 16), unless given
    assert (t.vector_registers, _core.Target(2).vector_registers) == (32, 16)
    assert _core.Target(2, vector_registers=32).vector_registers == 32
    assert "num_cores=4" in repr(t)


# A search far too long to finish before the interrupt (tens of seconds on 2 cores).
_LONG_CALL = textwrap.dedent(
    """
    import os, signal, sys, time
    # Started from a shell's background job, a process inherits SIGINT ignored: restore Python's.
    signal.signal(signal.SIGINT, signal.default_int_handler)
    from fastsearch import _core
    from fastsearch.ir.tir_import import program_json
    from fastsearch.cli.main import load_workload
    program = _core.Program(program_json(load_workload("C2D:0").func))
    cpu = _core.Target(2, vector_bytes=64)
    print("started", flush=True)
    t0 = time.perf_counter()
    try:
        program.propose(cpu, strategy="evolutionary", n=8, seed=0, measured={}, seeds=[],
                        population=65536, generations=64)
        print("completed", time.perf_counter() - t0, flush=True)
    except KeyboardInterrupt:
        print("interrupted", time.perf_counter() - t0, flush=True)
    os._exit(0)  # the abandoned search runs on in its thread: do not wait for it
    """
)


def test_ctrl_c_interrupts_a_long_call():
    child = subprocess.Popen(
        [sys.executable, "-c", _LONG_CALL], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True
    )
    assert child.stdout is not None
    assert child.stdout.readline().strip() == "started"
    try:
        subprocess.run([sys.executable, "-c", "import time; time.sleep(1.0)"], check=True)
        child.send_signal(signal.SIGINT)
        out, err = child.communicate(timeout=60)
    finally:
        child.kill()
    word, seconds = out.split()
    assert word == "interrupted", (out, err)
    assert float(seconds) < 20.0
