"""perfsdk-mlflow: perfsdk runs logged to an MLflow tracking store."""

__version__ = "0.1.0"
