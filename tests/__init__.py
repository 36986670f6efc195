"""The test suite, a package: pytest's default ("prepend") import mode puts the repository root, the folder above the
outermost package, first on the import path, so every test module has a unique dotted name
(``tests.unit.operator.core.builders.test_job``) and shared helpers are imported by name
(``from tests.unit.operator.rerankmodel_gen import model``), as are the benchmarks' (``from benchmarks import fleet``);
no test edits the import path or loads a file by its path.

- ``unit/``: pure and fake-cluster tests (seconds), in folders that mirror what they test: ``operator/`` (its
  ``controllers/``, ``adapters/``, ``core/<concept>/``), ``activator/``, ``sampler/``, ``contracts/``, ``devcluster/``,
  ``benchmarks/``, and ``project/`` for whole-repository checks (the chart, the docs, the linters);
- ``guard/``: the quality guard's statistics and its server;
- ``quantizer/``: the quantization Job (needs the quantizer's ML stack);
- ``cluster/``: the real control plane (``rerank_devcluster``), the operator as a real process;
- ``e2e/``: the README's demo, end to end.

Shared by several folders: ``class_policy_cases`` (unit/operator/core/tenancy and cluster), ``dockerfiles`` (unit and
quantizer).
"""
