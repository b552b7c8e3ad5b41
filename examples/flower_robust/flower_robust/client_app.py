"""The ClientApp: a fednorm party, then a FedAvg client on the normalized data."""

from __future__ import annotations

import numpy as np
from flwr.app import ArrayRecord, Context, Message, MetricRecord, RecordDict
from flwr.clientapp import ClientApp

from fednorm.flower import fitted_normalizer, register_party
from flower_robust.task import NodeData, accuracy, load_node_data, log_loss, train

app = ClientApp()


def training_rows(context: Context) -> np.ndarray:
    """What this node's party brings to the normalization: its training rows."""
    return load_node_data(context.node_config).X_train


# Step 1: answer the server's fednorm messages (the party runs in a worker on this node).
register_party(app, training_rows)


def normalized(context: Context) -> tuple[NodeData, np.ndarray, np.ndarray]:
    data = load_node_data(context.node_config)
    normalizer = fitted_normalizer(context)
    return data, normalizer.transform(data.X_train), normalizer.transform(data.X_test)


# Step 2: FedAvg of a logistic regression on the normalized rows.
@app.train()
def train_model(message: Message, context: Context) -> Message:
    data, X_train, _ = normalized(context)
    config = message.content["config"]
    model = train(message.content["arrays"].to_numpy_ndarrays(), X_train, data.y_train,
                  int(config["local-epochs"]), float(config["learning-rate"]))
    metrics = MetricRecord({"train-loss": log_loss(model, X_train, data.y_train),
                            "num-examples": len(X_train)})
    return Message(RecordDict({"arrays": ArrayRecord(model), "metrics": metrics}),
                   reply_to=message)


@app.evaluate()
def evaluate_model(message: Message, context: Context) -> Message:
    data, _, X_test = normalized(context)
    model = message.content["arrays"].to_numpy_ndarrays()
    metrics = MetricRecord({"eval-loss": log_loss(model, X_test, data.y_test),
                            "eval-acc": accuracy(model, X_test, data.y_test),
                            "num-examples": len(X_test)})
    return Message(RecordDict({"metrics": metrics}), reply_to=message)
