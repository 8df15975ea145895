"""The aggregator and attack sections: one-line refusals (exit 2), the notice, resuming an older checkpoint."""

from __future__ import annotations

import pytest

from conftest import refused_config, tiny_overrides
from raysim.checks import config_warnings
from raysim.config import load_config, to_flat_dict
from raysim.sections.robust import most_tolerated, tolerated


def refused(tmp_path, key: str, **extra) -> str:
    """The one-line ConfigError that loading refuses with (what the CLI prints, exit 2: ``refused_cli``)."""
    from raysim.config import ConfigError

    with pytest.raises(ConfigError) as err:
        load_config(None, tiny_overrides(tmp_path, **extra), warn=False)
    line = str(err.value)
    assert "\n" not in line and line.startswith(f"config key '{key}'"), line
    return line


def refused_cli(tmp_path, key: str, **extra) -> str:
    line = refused_config(key, *tiny_overrides(tmp_path, **extra))
    assert not (tmp_path / "run").exists()
    return line


def test_the_cli_refuses_in_one_line_with_exit_2(tmp_path):
    assert "n > 2f + 2" in refused_cli(tmp_path, "aggregator.f", aggregator__name="krum", aggregator__f=1)
    assert "scaffold" in refused_cli(tmp_path, "aggregator.name", aggregator__name="bulyan",
                                     algorithm__name="scaffold")


@pytest.mark.parametrize("name, n, f", [("krum", 4, 1), ("multikrum", 6, 2), ("bulyan", 6, 1), ("bulyan", 10, 2),
                                        ("trimmed_mean", 4, 2)])
def test_a_rule_told_to_tolerate_more_than_n_allows_is_refused(tmp_path, name, n, f):
    line = refused(tmp_path, "aggregator.f", clients__num=n, aggregator__name=name, aggregator__f=f)
    assert f"at most f={f - 1}" in line and f"n={n}" in line


def test_the_bounds_by_hand():
    # Krum: n > 2f + 2; Bulyan: n >= 4f + 3 (El Mhamdi et al.'s bound: n = 7 takes f = 1, n = 11 takes f = 2);
    # trimmed mean: 2f < n
    assert most_tolerated("krum", 5) == 1 and most_tolerated("krum", 4) == 0
    assert most_tolerated("bulyan", 7) == 1 and most_tolerated("bulyan", 6) == 0
    assert most_tolerated("bulyan", 11) == 2 and most_tolerated("bulyan", 10) == 1
    assert most_tolerated("trimmed_mean", 5) == 2 and most_tolerated("trimmed_mean", 4) == 1
    assert most_tolerated("median", 2) is None


def test_f_follows_the_attack_when_unset(tmp_path):
    cfg = load_config(None, tiny_overrides(tmp_path, clients__num=20, aggregator__name="krum",
                                           attack__name="sign_flip", attack__fraction=0.2), warn=False)
    assert tolerated(cfg) == 4
    # derived from the attack, and too many for the rule: the message says where f came from
    line = refused(tmp_path, "aggregator.f", clients__num=10, aggregator__name="bulyan", attack__name="alie")
    assert "from attack.fraction=0.2" in line


def test_unknown_names_are_refused(tmp_path):
    assert "krum" in refused(tmp_path, "aggregator.name", aggregator__name="krumm")
    assert "alie" in refused(tmp_path, "attack.name", attack__name="lie")


def test_a_method_that_is_not_a_model_average_is_refused_with_why(tmp_path):
    line = refused(tmp_path, "aggregator.name", aggregator__name="median", algorithm__name="scaffold")
    assert "model average" in line and "scaffold uploads named statistics" in line
    line = refused(tmp_path, "attack.name", attack__name="alie", algorithm__name="fedrep")
    assert "fedrep" in line


def test_asynchronous_rounds_are_refused(tmp_path):
    line = refused(tmp_path, "aggregator.name", aggregator__name="median", asynchronous__mode="fedbuff")
    assert "asynchronous.mode=off" in line


def test_bad_values_are_refused(tmp_path):
    refused(tmp_path, "attack.fraction", attack__name="sign_flip", attack__fraction=1.0)
    refused(tmp_path, "aggregator.tau", aggregator__name="centered_clip", aggregator__tau=0)
    refused(tmp_path, "aggregator.m", clients__num=6, aggregator__name="multikrum", aggregator__f=1,
            aggregator__m=6)


def test_the_notice_that_partial_sums_are_off():
    (line,) = [w for w in config_warnings(load_config(overrides=["aggregator.name=krum"], warn=False))
               if "aggregator" in w]
    assert "needs every upload" in line and "partial_sums" in line
    assert not [w for w in config_warnings(load_config(overrides=["attack.name=label_flip"], warn=False))
                if "attack" in w]  # a data attack keeps the sums
    assert [w for w in config_warnings(load_config(overrides=["attack.name=ipm"], warn=False)) if "attack" in w]


def test_an_older_checkpoint_without_these_sections_resumes(tmp_path):
    from raysim.engine.runner import check_checkpoint_config
    from raysim.errors import UserError

    cfg = load_config(warn=False)
    older = {k: v for k, v in to_flat_dict(cfg).items() if not k.startswith(("aggregator.", "attack."))}
    check_checkpoint_config(tmp_path, {"config": older}, cfg)
    with pytest.raises(UserError, match=r"aggregator\.name \('mean' in the checkpoint, 'median' now\)"):
        check_checkpoint_config(tmp_path, {"config": older}, load_config(overrides=["aggregator.name=median"],
                                                                         warn=False))


def test_fltrust_without_a_public_split_is_refused(tmp_path):
    line = refused_cli(tmp_path, "aggregator.root", aggregator__name="fltrust")
    assert "public split" in line and "server_holdout" in line
    line = refused(tmp_path, "data.server_holdout", aggregator__name="fltrust", aggregator__root="server_holdout")
    assert "fltrust" in line
    refused(tmp_path, "aggregator.root", aggregator__name="fltrust", aggregator__root="test")


@pytest.mark.parametrize("rule", ["mean", "norm_bound", "fltrust", "foolsgold"])
def test_a_pre_aggregation_step_with_a_rule_that_cannot_take_it_is_refused(tmp_path, rule):
    extra = dict(aggregator__name=rule, attack__name="ipm", data__server_holdout=0.1,
                 aggregator__root="server_holdout")
    line = refused_cli(tmp_path, "aggregator.nnm", aggregator__nnm="true", **extra)
    assert f"aggregator.name={rule}" in line and "pre-aggregation" in line
    refused(tmp_path, "aggregator.bucket", aggregator__bucket=2, **extra)


def test_bucketing_counts_against_the_rules_bound(tmp_path):
    # 12 clients, f = 2: Krum takes them (12 > 6), but not 6 buckets of 2 (6 is not > 2f + 2)
    load_config(None, tiny_overrides(tmp_path, clients__num=12, aggregator__name="krum", aggregator__f=2),
                warn=False)
    line = refused(tmp_path, "aggregator.bucket", clients__num=12, aggregator__name="krum", aggregator__f=2,
                   aggregator__bucket=2)
    assert "n=6 buckets" in line and "at most f=1" in line
    # the median has no bound: any bucket size
    load_config(None, tiny_overrides(tmp_path, clients__num=12, aggregator__name="median", aggregator__bucket=5),
                warn=False)


def test_the_new_keys_bad_values_are_refused(tmp_path):
    refused(tmp_path, "aggregator.bucket", aggregator__name="median", aggregator__bucket=1)
    refused(tmp_path, "aggregator.nu", aggregator__name="geomed", aggregator__nu=0)
    refused(tmp_path, "aggregator.maxiter", aggregator__name="geomed", aggregator__maxiter=0)
    refused(tmp_path, "aggregator.root_samples", aggregator__root_samples=0)
    assert "karimireddy" in refused(tmp_path, "attack.z_rule", attack__name="alie", attack__z_rule="epfml")
    refused(tmp_path, "attack.perturbation", attack__name="minmax", attack__perturbation="unit")
    refused(tmp_path, "attack.gamma_init", attack__name="minmax", attack__gamma_init=0)
    refused(tmp_path, "attack.mimic_warmup", attack__name="mimic", attack__mimic_warmup=0)
    refused(tmp_path, "attack.dba_size", attack__name="dba", attack__dba_size=0)
    refused(tmp_path, "attack.dba_gap", attack__name="dba", attack__dba_gap=-1)


def test_what_the_data_rules_out_is_refused_before_round_1(tmp_path):
    """FLTrust's root samples beyond the holdout, a distributed trigger larger than the images: one line each."""
    from raysim.engine.runner import run_experiment
    from raysim.errors import UserError

    cfg = load_config(None, tiny_overrides(tmp_path, aggregator__name="fltrust", aggregator__root="server_holdout",
                                           data__server_holdout=0.05), warn=False)
    with pytest.raises(UserError, match=r"^config key 'aggregator\.root_samples': 100 root samples, and data"):
        run_experiment(cfg)
    # digits are 8x8: bars of 4 with a gap of 2 need 10 columns
    cfg = load_config(None, tiny_overrides(tmp_path, attack__name="dba", log__dir=str(tmp_path / "dba")), warn=False)
    with pytest.raises(UserError, match=r"^config key 'attack\.dba_size': .* at least 4x10, .* \[1, 8, 8\]$"):
        run_experiment(cfg)
