"""The study: federated learning with local, federated, pooled or activation normalization.

Modules, in the order a run uses them:

* ``data``: partition a dataset among clients with a skew, then split each client's rows;
* ``normalization``: the normalization modes (``none``, ``local_<m>``, ``federated_<m>``,
  ``pooled_<m>``, ``<layer>_norm``) and the centralized references (``central_model``,
  ``central_linear``) applied to the clients;
* ``models``: the paper's MLPs and CNNs with a choice of activation normalization;
* ``fedavg``: FedAvg's loop, early stopping on the server's validation loss, the kept
  weights chosen by validation loss or F1;
* ``rounds``: a FedAvg round with all clients (and several runs) trained together, and
  the one-by-one reference;
* ``metrics``: test F1 (weighted and macro) / precision / recall / accuracy, MAE and R²;
* ``baselines``: the fitted references (linear, majority class, (age, sex) lookup);
* ``grid``, ``settings``, ``runner``, ``progress``: the resumable experiment grid;
* ``tuning``: the tuning view of a partition and the ranking of candidate settings;
* ``report``, ``scores``, ``inference``, ``tables``, ``figures``, ``readme``: Table III
  by margin and by paired intervals, per-method means, figures, and the generated
  blocks of the documents that quote them.

``data``, ``normalization``, ``metrics``, ``grid``, ``progress``, ``tuning`` and the
report modules do not import torch, so the core install can validate a grid and
summarize results; the other modules need the ``train`` extra. Nothing is imported
here, to keep it that way.
"""
