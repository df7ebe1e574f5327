"""The lab's tools take the product's flag declarations: bench, soak and coldcheck show
--verify-linear and --verify-attention exactly as sweep does (one declaration, console/request.py)."""

import pytest

from tests.test_linear import help_of


@pytest.mark.parametrize("flag", ["--verify-linear", "--verify-attention"])
def test_the_lab_tools_declare_the_verify_choices_as_sweep_does(flag):
    helps = {args: help_of(flag, *args) for args in [("lab.bench",), ("lab.soak",), ("lab.coldcheck",),
                                                     ("blockwidth.console.cli", "sweep")]}
    assert len(set(helps.values())) == 1, helps
