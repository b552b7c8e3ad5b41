#!/bin/sh
# The rest of the tabular grid, most useful runs first: Table III needs only the
# local/federated pairs, so seed 0's input normalizations go first, then seed 0's
# activation norms, then everything else (seeds 1-2). Each command resumes.
set -e
INPUT=none,local_zscore,federated_zscore,local_minmax,federated_minmax,local_robust,federated_robust,local_yeojohnson,federated_yeojohnson
fednorm experiment --datasets parkinsons --seeds 0 --normalizations $INPUT --jobs 1 --out results/tabular.csv
fednorm experiment --datasets parkinsons --seeds 0 --jobs 1 --out results/tabular.csv
fednorm experiment --datasets parkinsons --normalizations $INPUT --jobs 1 --out results/tabular.csv
fednorm experiment --preset tabular --jobs 1 --out results/tabular.csv
