-- Run once by the postgres image on an empty volume: MLflow's database is POSTGRES_DB (mlflow);
-- Optuna's study storage gets its own (both use Alembic's version table).
CREATE DATABASE optuna;
