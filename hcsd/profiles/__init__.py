"""The chip profile database: what each accelerator model can do, and rates between models."""

from hcsd.profiles.database import (
    FIGURES,
    Profile,
    ProfileDatabase,
    ProfileError,
    default_database,
    normalise_name,
)

__all__ = [
    "FIGURES",
    "Profile",
    "ProfileDatabase",
    "ProfileError",
    "default_database",
    "normalise_name",
]
