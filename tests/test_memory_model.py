"""Fitted memory models: recover known coefficients, bound the residuals, survive save/load."""

from __future__ import annotations

import json

import numpy as np
import pytest

from fitbatch.costs import PaddedPolynomial, resolve_cost
from fitbatch.memory import (
    BatchMemoryModel,
    SizeMemoryModel,
    fit_batch_model,
    fit_size_model,
    load_memory_model,
)
from fitbatch.memory._fit import _t_quantile


def grid(seed=0, n=40):
    rng = np.random.default_rng(seed)
    counts = rng.integers(1, 64, n)
    lengths = rng.integers(16, 4096, n)
    return counts, lengths


def true_peak(c, L):
    return 2.5e9 + c * (1.2e5 + 3.1e3 * L + 0.75 * L**2)


def test_batch_model_recovers_known_coefficients():
    c, L = grid()
    model = fit_batch_model(c, L, true_peak(c, L))
    assert isinstance(model, PaddedPolynomial) and isinstance(model, BatchMemoryModel)
    mean = model.mean
    np.testing.assert_allclose(
        [mean.fixed, mean.linear, mean.per_token, mean.quadratic],
        [2.5e9, 1.2e5, 3.1e3, 0.75],
        rtol=1e-7,
    )
    assert model.margin < 1e-6


def test_batch_model_bound_covers_noise_and_held_out():
    rng = np.random.default_rng(1)
    c, L = grid(1, 60)
    noisy = true_peak(c, L) * (1 + rng.normal(0, 0.01, len(c)))
    model = fit_batch_model(c, L, noisy, confidence=0.99)
    assert 0.015 < model.margin < 0.06
    assert np.all(model.predict(c, L) >= noisy)  # never below a fitted sample
    hc, hL = grid(2, 500)
    held = true_peak(hc, hL) * (1 + rng.normal(0, 0.01, len(hc)))
    covered = np.mean(model.predict(hc, hL) >= held)
    assert covered > 0.98
    mean_err = np.abs(model.predict(hc, hL, upper=False) / true_peak(hc, hL) - 1)
    assert mean_err.max() < 0.01


def test_batch_model_is_a_planner_cost_model():
    c, L = grid()
    model = fit_batch_model(c, L, true_peak(c, L) * 1.0)
    resolved = resolve_cost(model)
    assert resolved is model
    budget = 40e9
    counts = model.max_count(np.array([512.0, 2048.0]), budget)
    # the closed-form count fits the budget and one more does not
    for n, length in zip(np.floor(counts), [512.0, 2048.0], strict=True):
        assert model.evaluate(np.array([n]), np.array([length]), np.array([0.0]))[0] <= budget
        assert model.evaluate(np.array([n + 1]), np.array([length]), np.array([0.0]))[0] > budget


def test_batch_model_nonnegative_coefficients():
    # data that an unconstrained fit would explain with a negative quadratic term
    c = np.array([1, 2, 4, 1, 2, 4, 1, 2])
    L = np.array([100, 100, 100, 1000, 1000, 1000, 3000, 3000])
    peaks = 1e6 + c * (5e3 * L - 0.4 * L**2)
    model = fit_batch_model(c, L, peaks)
    assert min(model.fixed, model.linear, model.per_token, model.quadratic) >= 0
    assert np.all(model.predict(c, L) >= peaks)


def test_batch_model_save_load_roundtrip(tmp_path):
    rng = np.random.default_rng(3)
    c, L = grid(3)
    model = fit_batch_model(c, L, true_peak(c, L) * (1 + rng.normal(0, 0.005, len(c))))
    path = tmp_path / "batch.json"
    model.save(path)
    data = json.loads(path.read_text())
    assert data["kind"] == "batch_memory" and data["version"] == 1
    loaded = load_memory_model(path)
    assert loaded == model
    np.testing.assert_array_equal(loaded.predict(c, L), model.predict(c, L))
    assert BatchMemoryModel.from_dict(model.to_dict()) == model


def test_batch_model_refit_with_failure():
    c, L = grid()
    model = fit_batch_model(c, L, true_peak(c, L))
    # a batch the model says fits in 40 GB ran out of memory at 40 GB
    n = float(np.floor(model.max_count(np.array([1024.0]), 40e9)[0]))
    refit = model.refit(n, 1024, 40e9 * 1.02)
    assert refit.predict([n], [1024])[0] >= 40e9 * 1.02
    assert refit.max_count(np.array([1024.0]), 40e9)[0] < n
    assert len(refit.samples) == len(model.samples) + 1


def test_size_model_degree_six_is_accurate():
    # raw powers of sizes up to 5000 (size**6 ~ 1.6e22) ruin an unscaled fit; mapped inputs do not
    x = np.linspace(10, 5000, 80)
    coef = [3e8, 2e5, 40.0, 1e-3, 2e-7, 1e-11, 1e-15]
    y = np.polynomial.polynomial.polyval(x, coef)
    model = fit_size_model(x, y, degree=6)
    xt = np.linspace(12, 4990, 37)
    np.testing.assert_allclose(
        model.predict(xt, upper=False), np.polynomial.polynomial.polyval(xt, coef), rtol=1e-9
    )
    np.testing.assert_allclose(model.raw(xt), np.polynomial.polynomial.polyval(xt, coef), rtol=1e-9)


def test_size_model_is_monotone_and_extrapolates_up():
    # a fitted polynomial that turns down inside and beyond its domain
    x = np.linspace(0, 10, 30)
    y = 100 + 20 * x - 1.5 * x**2 + 1
    model = fit_size_model(x, y, degree=2)
    xs = np.linspace(-5, 40, 1000)
    pred = model.predict(xs)
    assert np.all(np.diff(pred) >= -1e-9)
    assert resolve_cost(model) is model  # passes the planner's monotonicity probe
    np.testing.assert_allclose(
        model.predict([3.0], upper=False), [y[0] + 20 * 3 - 1.5 * 9 - 100 + 100], rtol=1e-9
    )
    peak_value = 100 + 20 * (20 / 3) - 1.5 * (20 / 3) ** 2 + 1
    np.testing.assert_allclose(
        model.predict([9.0, 20.0], upper=False), [peak_value, peak_value], rtol=1e-9
    )


def test_size_model_cost_is_count_times_padded_prediction():
    x = np.arange(1, 50)
    model = fit_size_model(x, 10 + 2.0 * x, degree=1)
    cost = model.evaluate(np.array([4, 2]), np.array([10, 30]), np.array([25, 40]))
    np.testing.assert_allclose(cost, [4 * 30, 2 * 70], rtol=1e-9)


def test_size_model_save_load_and_module_state(tmp_path):
    torch = pytest.importorskip("torch")
    from fitbatch.memory import PolynomialRegression

    rng = np.random.default_rng(4)
    x = rng.uniform(10, 3000, 50)
    y = (5e6 + 3e3 * x + 0.4 * x**2) * (1 + rng.normal(0, 0.01, 50))
    model = fit_size_model(x, y, degree=3)
    assert load_memory_model(model.to_dict()) == model
    model.save(tmp_path / "size.json")
    assert load_memory_model(tmp_path / "size.json") == model

    module = model.to_module()
    assert isinstance(module, PolynomialRegression) and isinstance(module, torch.nn.Module)
    torch.save(module.state_dict(), tmp_path / "poly.pt")
    fresh = PolynomialRegression(3)
    fresh.load_state_dict(torch.load(tmp_path / "poly.pt"))
    restored = fresh.to_cost_model()
    assert restored.coef == model.coef and restored.margin == model.margin
    xt = torch.linspace(20, 2900, 11, dtype=torch.float64)
    np.testing.assert_allclose(fresh(xt).numpy(), model.raw(xt.numpy()), rtol=1e-12)

    # the seed's API: PolynomialRegression(degree).fit(x, y), then forward
    seed = PolynomialRegression(2)
    seed.fit(torch.tensor(x), torch.tensor(y))
    assert seed.state_dict()["coef"].shape == (3,)
    np.testing.assert_allclose(seed(torch.tensor([1000.0])).numpy(), [5e6 + 3e6 + 4e5], rtol=0.03)


def test_plot_writes_image(tmp_path):
    pytest.importorskip("matplotlib")
    c, L = grid()
    model = fit_batch_model(c, L, true_peak(c, L))
    model.plot(tmp_path / "fit.png")
    assert (tmp_path / "fit.png").stat().st_size > 1000
    size = fit_size_model([1, 2, 3, 4], [2, 4, 6, 8], degree=1)
    size.plot(tmp_path / "size.png", title="size model")
    assert (tmp_path / "size.png").exists()


@pytest.mark.parametrize(
    "args, kwargs, match",
    [
        (([1, 2, 3], [1, 2, 3], [1, 2, 3]), {}, "at least 4"),
        (([1, 2, 3, 4], [1, 2, 3], [1, 2, 3, 4]), {}, "lengths has 3 values"),
        (([1, 2, 3, 4], [1, 2, 3, 4], [1, 2, 0, 4]), {}, r"peaks\[2\] = 0.0"),
        (([1, 2, 3, 4], [1, 2, -3, 4], [1, 2, 3, 4]), {}, r"lengths\[2\] = -3.0"),
        (([1, 2, 3, 4], [1, 2, 3, 4], [1, 2, 3, 4]), {"confidence": 1.0}, "confidence"),
    ],
)
def test_batch_fit_validation(args, kwargs, match):
    with pytest.raises(ValueError, match=match):
        fit_batch_model(*args, **kwargs)


def test_size_fit_and_load_validation():
    with pytest.raises(ValueError, match="degree must be"):
        fit_size_model([1, 2, 3], [1, 2, 3], degree=13)
    with pytest.raises(ValueError, match="two distinct sizes"):
        fit_size_model([2, 2, 2], [1, 2, 3], degree=1)
    with pytest.raises(ValueError, match="at least 4 measurements"):
        fit_size_model([1, 2, 3], [1, 2, 3], degree=3)
    with pytest.raises(ValueError, match="unknown memory model kind"):
        load_memory_model({"kind": "nope"})
    good = fit_size_model([1, 2, 3], [1, 2, 3], degree=1).to_dict()
    with pytest.raises(ValueError, match="version"):
        load_memory_model({**good, "version": 99})
    with pytest.raises(ValueError, match="unknown keys"):
        load_memory_model({**good, "extra": 1})
    with pytest.raises(ValueError, match="domain"):
        SizeMemoryModel(coef=(1.0,), domain=(2.0, 1.0))


def test_t_quantile_against_tables():
    # two-sided 98 % table values of Student's t (one-sided 0.99)
    for dof, expected in [(1, 31.821), (2, 6.965), (5, 3.365), (10, 2.764), (30, 2.457)]:
        assert _t_quantile(0.99, dof) == pytest.approx(expected, rel=0.01)


def test_a_fit_that_predicts_zero_under_a_measured_peak_is_refused():
    """No margin makes a prediction of 0 an upper bound (an OverflowError came out of the margin)."""
    from fitbatch.memory import fit_size_model

    with pytest.raises(ValueError, match=r"the fit predicts .* at measurement \d+, whose peak is .*lower degree"):
        fit_size_model([100, 200, 300, 400, 500], [1e7, 1e3, 1e7, 1e7, 1e5], degree=1)
