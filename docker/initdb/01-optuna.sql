-- Run once by the postgres image on an empty volume: MLflow's database is POSTGRES_DB (mlflow);
-- Optuna's study storage gets its own (both use Alembic's version table). The MLflow login's
-- users (mlflow_auth) are made by the mlflow service itself (accel.tracking.auth), also on a
-- volume from before the login.
CREATE DATABASE optuna;
