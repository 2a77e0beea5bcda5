"""The suite's service answers the official SDK, and each new key is an account of its own."""

import pytest

pytestmark = pytest.mark.e2e


def test_the_service_answers_the_sdk_with_a_new_account_of_its_own(people_service):
    first, second = people_service.new_key(), people_service.new_key()
    assert first != second
    models = people_service.client(first).models.list()
    assert any(m.id.startswith("qwen") for m in models.data)
    assert people_service.client(second).files.list().data == []
