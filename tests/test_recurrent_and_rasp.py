"""Chapter 8: the linear recurrent model (against its own step-by-step recurrence), its experiment and
runner, and the lag-agreement diagnostic of the RASP-L contrast."""
import pytest
import torch
import torch.nn.functional as F
from torch import nn

from lengthgen_utils.run.configs import RecurrentExperiment
from lengthgen_utils.run.evaluation import accuracy_by_length, lag_agreement
from lengthgen_utils.core.models import LinearRNN
from lengthgen_utils.run.runners import run_recurrent
from lengthgen_utils.core.tasks import Copy, DelayedCopy, FixedOffsetRetrieval
from lengthgen_utils.run.training import train


def test_the_kernel_readout_is_the_recurrence():
    model = LinearRNN(16, d_state=8, init_scale=0.7, n_models=3).double()
    tokens = torch.randint(0, 17, (5, 13), generator=torch.Generator().manual_seed(0))
    logits, norms = model(tokens)
    reference = torch.einsum("mvn,mbn->mbv", model.C, model.states(tokens))  # C h_{L-1}, step by step
    torch.testing.assert_close(logits, reference)
    assert norms.shape == (3, 13)
    torch.testing.assert_close(norms, model.kernel_norm(13).to(norms))  # row layout: column j is ||C A^(12-j) B||
    K = model.kernel(13)  # [M, d, V, V+1]
    torch.testing.assert_close(norms[:, -1], K[:, 0].flatten(1).norm(dim=-1))  # D = 0: ||C B||, the last column
    torch.testing.assert_close(norms[:, 0], K[:, 12].flatten(1).norm(dim=-1))  # D = -12: the first
    per_model = tokens.expand(3, 5, 13)
    torch.testing.assert_close(model(per_model)[0], logits)  # the [M, B, L] path agrees


def test_kernel_is_c_a_power_d_b():
    model = LinearRNN(4, d_state=3, init_scale=0.5, n_models=2).double()
    K = model.kernel(4)
    for d in range(4):
        torch.testing.assert_close(K[:, d], model.C @ torch.linalg.matrix_power(model.A, d) @ model.B)
    assert torch.allclose(model.spectral_radius(), torch.linalg.eigvals(model.A.detach()).abs().max(-1).values)


def test_an_unstable_recurrence_refuses_instead_of_returning_inf():
    model = LinearRNN(16, d_state=4, n_models=1)
    with torch.no_grad():
        model.A.copy_(torch.eye(4)[None] * 3.0)
    with pytest.raises(ValueError, match="overflows"):
        model(torch.zeros(1, 200, dtype=torch.long))
    model(torch.zeros(1, 20, dtype=torch.long))  # fine where it does not overflow


def test_bad_input_is_refused():
    model = LinearRNN(16, n_models=2)
    with pytest.raises(ValueError, match="no positions"):
        model(torch.zeros(1, 5, dtype=torch.long), positions=torch.arange(5))
    with pytest.raises(ValueError, match="tokens must lie"):
        model(torch.full((1, 5), 17, dtype=torch.long))
    with pytest.raises(ValueError, match="d_state"):
        LinearRNN(16, d_state=0)
    with pytest.raises(ValueError, match="init_scale"):
        LinearRNN(16, init_scale=-1.0)


def test_ensemble_member_equals_the_model_trained_alone():
    tasks = [FixedOffsetRetrieval(8, 1), FixedOffsetRetrieval(8, 2)]
    both = LinearRNN(8, d_state=6, n_models=2, seeds=[3, 4])
    train(both, tasks, steps=6, batch_size=16, train_len=8, min_train_len=4, device="cpu")
    alone = LinearRNN(8, d_state=6, n_models=1, seeds=[4])
    train(alone, tasks[1], steps=6, batch_size=16, train_len=8, min_train_len=4, device="cpu")
    for (name, p_both), (_, p_alone) in zip(both.named_parameters(), alone.named_parameters()):
        torch.testing.assert_close(p_both[1:], p_alone, rtol=1e-5, atol=1e-6, msg=name)
    copy = both.subset([1])
    torch.testing.assert_close(copy.A, alone.A, rtol=1e-5, atol=1e-6)


def test_a_trained_recurrent_model_learns_and_keeps_the_offset(tmp_path):
    exp = RecurrentExperiment(offsets=(1, 2), n_seeds=2, steps=300, batch_size=64, vocab_size=8, train_len=8,
                              d_state=16, eval_samples=256, length_multiples=(1, 4))
    result = run_recurrent(exp, cache=tmp_path, device="cpu")
    assert result.accuracy.shape == (4, 2) and result.offsets == [1, 1, 2, 2]
    assert result.where(offset=2).model.n_models == 2 and result.where(offset=2).seeds == [0, 1]
    assert (result.accuracy >= 0.95).all(), result.accuracy
    again = run_recurrent(exp, cache=tmp_path, device="cpu")  # loaded from the cache: the same model
    torch.testing.assert_close(again.model.A, result.model.A)
    torch.testing.assert_close(accuracy_by_length(again.model, exp.tasks, [8, 32], n_samples=256), result.accuracy)
    with pytest.raises(ValueError, match="no member matches"):
        result.where(offset=3)


def test_recurrent_experiment_validates():
    with pytest.raises(ValueError, match="distinct"):
        RecurrentExperiment(offsets=(1, 1))
    with pytest.raises(ValueError, match="train_len"):
        RecurrentExperiment(offsets=(1, 20))
    exp = RecurrentExperiment(offsets=[1, 3], n_seeds=2)
    assert exp.offsets == (1, 3) and exp.n_models == 4 and exp.seeds == [0, 1, 0, 1]
    assert [t.offset for t in exp.tasks] == [1, 1, 3, 3] and exp.shortest_train_len == 5
    assert hash(exp) != hash(RecurrentExperiment(offsets=(1, 3), n_seeds=2, d_state=8))


class _ReadsBack(nn.Module):
    """A stand-in sequence model whose prediction at t is the token ``lag`` back (a perfect fixed-offset rule)."""

    def __init__(self, lag, n_tokens):
        super().__init__()
        self.lag, self.n_tokens = lag, n_tokens
        self.dummy = nn.Parameter(torch.zeros(2, 1))

    @property
    def device(self):
        return self.dummy.device

    def check_positions(self, positions):
        """Any length (what an evaluation function asks before running the model)."""

    def forward(self, tokens):
        shifted = torch.roll(tokens, self.lag, dims=-1)
        return F.one_hot(shifted, self.n_tokens).float()[None].expand(2, -1, -1, -1)


def test_lag_agreement_finds_the_offset_a_model_reads_from():
    model = _ReadsBack(16, 17)
    torch.testing.assert_close(lag_agreement(model, Copy(16), 65, lag=16, min_position=33),
                               torch.ones(2, dtype=torch.float64))
    other = lag_agreement(model, Copy(16), 65, lag=32, min_position=33)
    assert (other < 0.2).all()  # the task's own offset: chance-level agreement (repeated tokens aside)
    with pytest.raises(ValueError, match="no scored position"):
        lag_agreement(model, DelayedCopy(16, 1), 8, lag=3, min_position=8)


# ---------------------------------------------------------------- chapter 8's contrasts
def test_a_rotation_transition_is_orthogonal_with_unit_eigenvalues():
    from lengthgen_utils.core.models import rotation_transition

    theta = torch.tensor([[0.3, 2.0], [1.0, 0.0]], dtype=torch.float64)
    A = rotation_transition(theta)
    assert A.shape == (2, 4, 4)
    torch.testing.assert_close(A @ A.transpose(1, 2), torch.eye(4, dtype=torch.float64).expand(2, 4, 4))
    torch.testing.assert_close(torch.linalg.eigvals(A).abs(), torch.ones(2, 4, dtype=torch.float64))
    torch.testing.assert_close(A[0, 2:, 2:], torch.tensor([[2.0, -2.0], [2.0, 2.0]]).cos() * torch.eye(2) +
                               torch.tensor([[0.0, -1.0], [1.0, 0.0]]) * torch.tensor(2.0).sin(), check_dtype=False)
    assert A[0, :2, 2:].abs().max() == 0  # block-diagonal
    with pytest.raises(TypeError, match="theta must be a float tensor"):
        rotation_transition(torch.zeros(3))


def test_a_rotation_rnn_keeps_b_and_c_of_the_free_model_and_cannot_decay():
    free = LinearRNN(16, d_state=8, n_models=2, seeds=[5, 6])
    rot = LinearRNN(16, d_state=8, n_models=2, seeds=[5, 6], transition="rotation")
    assert [n for n, _ in rot.named_parameters()] == ["B", "C", "theta"]
    torch.testing.assert_close(rot.B, free.B)
    torch.testing.assert_close(rot.C, free.C)
    torch.testing.assert_close(rot.spectral_radius(), torch.ones(2, dtype=torch.float64))
    norms = rot.kernel_norm(200)
    assert (norms[:, 100:].max(1).values > 0.5 * norms[:, :100].max(1).values).all()  # no decay
    logits, _ = rot(torch.randint(0, 17, (3, 9), generator=torch.Generator().manual_seed(1)))
    logits.sum().backward()
    assert rot.theta.grad is not None and rot.theta.grad.abs().sum() > 0  # the angles train
    copy = rot.subset([1])
    torch.testing.assert_close(copy.A[0], rot.A[1].detach())
    assert copy.config.transition == "rotation"
    with pytest.raises(ValueError, match="transition must be one of"):
        LinearRNN(16, transition="unitary")
    with pytest.raises(ValueError, match="d_state must be even"):
        LinearRNN(16, d_state=7, transition="rotation")
    with pytest.raises(ValueError, match="transition must be one of"):
        RecurrentExperiment(transition="unitary")


def test_training_over_several_lengths_draws_only_lengths_the_task_accepts(monkeypatch):
    from lengthgen_utils.core.models import Transformer
    from lengthgen_utils.run.configs import TransformerExperiment
    from lengthgen_utils.run import training

    assert Copy(16).valid_lengths(17, 33) == list(range(17, 34, 2))
    assert DelayedCopy(16, 5).valid_lengths(6, 8) == [6, 7, 8]
    with pytest.raises(ValueError, match="no length"):
        Copy(16).valid_lengths(18, 18)
    seen = []
    draw = Copy.sample  # the training loop draws its batches here

    def record(self, batch_size, seq_len, *args, **kwargs):
        seen.append(seq_len)
        return draw(self, batch_size, seq_len, *args, **kwargs)

    monkeypatch.setattr(Copy, "sample", record)
    model = Transformer(17, 1, 2, 16, max_len=33)
    training.train_sequence(model, Copy(16), steps=30, batch_size=4, train_len=33, min_train_len=17, device="cpu")
    assert set(seen) <= set(range(17, 34, 2)) and len(set(seen)) >= 4, seen
    seen.clear()
    training.train_sequence(model, Copy(16), steps=3, batch_size=4, train_len=33, device="cpu")
    assert seen == [33, 33, 33]  # without min_train_len: the one length, as in chapter 7
    with pytest.raises(ValueError, match="min_train_len"):
        TransformerExperiment(task=Copy(16), train_len=33, min_train_len=40, eval_lengths=(33,))
    with pytest.raises(ValueError, match="min_train_len"):
        training.train_sequence(model, Copy(16), steps=1, train_len=33, min_train_len=1, device="cpu")


def test_chapter_8_reads_kernels_in_the_row_layout_and_splits_fit_from_hold():
    from lengthgen_utils.book import ch08

    model = LinearRNN(4, d_state=3, init_scale=0.5, n_models=2).double()
    by_distance = torch.stack([model.kernel(6)[:, d].flatten(1).norm(dim=1) for d in range(6)], 1)  # column d
    far = by_distance[:, 3:].max(1).values / by_distance[:, 1]  # distances 3..5 against d = 1
    torch.testing.assert_close(ch08.far_weight(model, 1, 3, 6), far)
    with pytest.raises(ValueError, match="target"):
        ch08.far_weight(model, 3, 3, 6)
    acc = torch.tensor([[1.0, 0.9, 0.5], [0.9, 0.95, 0.92]])
    fitted, lowest, drop = ch08.fit_and_hold(acc)
    assert fitted.tolist() == [True, False]
    torch.testing.assert_close(lowest, torch.tensor([0.5, 0.9]))
    torch.testing.assert_close(drop, torch.tensor([0.5, -0.02]))
    with pytest.raises(ValueError, match="accuracy must be"):
        ch08.fit_and_hold(torch.ones(3))
    table = ch08.halves_table({33: torch.tensor([0.9, 1.0]), 17: torch.tensor([1.0, 1.0])}, range(8, 13), "c")
    assert [row[:3] for row in table.cells] == [["17", "8", "yes"], ["33", "16", "no"]]
