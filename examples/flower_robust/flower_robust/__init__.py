"""flower_robust: fednorm robust scaling inside Flower, then FedAvg on the scaled data."""
