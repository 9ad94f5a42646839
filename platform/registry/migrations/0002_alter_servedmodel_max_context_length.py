"""max_context_length gets an upper bound (2**24 tokens): a validator only, no database change."""

import django.core.validators
from django.db import migrations, models


class Migration(migrations.Migration):
    dependencies = [
        ("registry", "0001_initial"),
    ]

    operations = [
        migrations.AlterField(
            model_name="servedmodel",
            name="max_context_length",
            field=models.PositiveIntegerField(
                validators=[
                    django.core.validators.MinValueValidator(1),
                    django.core.validators.MaxValueValidator(16777216),
                ]
            ),
        ),
    ]
