"""The ServerApp: fednorm normalization over the nodes, then Flower's FedAvg."""

from __future__ import annotations

import json
from logging import INFO
from pathlib import Path

from flwr.app import ArrayRecord, ConfigRecord, Context
from flwr.common.logger import log
from flwr.serverapp import Grid, ServerApp
from flwr.serverapp.strategy import FedAvg

from fednorm.flower import FlowerNormalization, normalize, wait_for_nodes
from fednorm.multihost.files import json_params
from fednorm.protocols import FitOptions
from flower_robust.task import bcw_features, initial_model

app = ServerApp()


def feature_names(config: dict[str, object]) -> list[str]:
    """The columns' names: the run config's ``features`` (comma-separated, as every
    node's data holds them), or, if empty, those of the BCW rows the partitions hold."""
    names = str(config.get("features", ""))
    return [name.strip() for name in names.split(",")] if names else bcw_features()


def fit_options(config: dict[str, object]) -> FitOptions:
    vabs = float(config["vabs"])  # type: ignore[arg-type]
    return FitOptions(relative_epsilon=float(config["relative-epsilon"]),  # type: ignore[arg-type]
                      preset=str(config["preset"]), vabs=(vabs,))


@app.main()
def main(grid: Grid, context: Context) -> None:
    config = context.run_config
    num_nodes = int(config["num-nodes"])
    timeout = float(config["timeout"])

    # Step 1: the fednorm protocol, every party on its own node.
    nodes = wait_for_nodes(grid, num_nodes, timeout)
    fitted = normalize(grid, nodes, str(config["method"]), str(config["privacy"]),
                       fit_options(config), timeout=timeout, features=feature_names(config),
                       progress=lambda line: log(INFO, line))
    log(INFO, "fednorm %s-%s: %d protocol rounds in %d Flower rounds, %.1f s",
        config["method"], config["privacy"], fitted.protocol_rounds, fitted.flower_rounds,
        fitted.seconds)

    # Step 2: FedAvg on the normalized client data.
    strategy = FedAvg(fraction_train=1.0, fraction_evaluate=1.0, min_train_nodes=num_nodes,
                      min_evaluate_nodes=num_nodes, min_available_nodes=num_nodes)
    result = strategy.start(
        grid=grid,
        initial_arrays=ArrayRecord(initial_model(fitted.normalizer.n_features)),
        num_rounds=int(config["num-server-rounds"]),
        timeout=timeout,
        train_config=ConfigRecord({"local-epochs": int(config["local-epochs"]),
                                   "learning-rate": float(config["learning-rate"])}),
    )
    if config["out-dir"]:
        write_result(Path(str(config["out-dir"])), config, fitted,
                     result.evaluate_metrics_clientapp)


def write_result(out: Path, config: dict[str, object], fitted: FlowerNormalization,
                 evaluations: dict[int, object]) -> None:
    """The normalizer and the FedAvg evaluation, as JSON (NaN parameters become null);
    ``features`` and ``params`` as ``fednorm simulate --json`` writes them."""
    names = fitted.normalizer.feature_names
    document = {
        "method": config["method"],
        "privacy": config["privacy"],
        "session": fitted.session,
        "parties": {str(party): node for party, node in fitted.parties.items()},
        "features": None if names is None else list(names),
        "params": json_params(fitted.normalizer.params()),
        "protocol_rounds": fitted.protocol_rounds,
        "flower_rounds": fitted.flower_rounds,
        "seconds": fitted.seconds,
        "evaluate": {str(r): dict(metrics) for r, metrics in evaluations.items()},
    }
    out.mkdir(parents=True, exist_ok=True)
    (out / "result.json").write_text(json.dumps(document, indent=2) + "\n")
