//! The `direct` strategy on one instance: each open sequence owns a batch row (its slot), and a
//! batch carries the ready request of every slot, at the slot's row.
//!
//! One task per instance gathers requests. When the first arrives, it waits up to the
//! strategy's queue delay for every other open sequence of the instance to send its next
//! request, then runs rows `0..=highest ready slot` as one batch through the instance's
//! batcher. A slot with nothing ready gets a filler row: zeros, with READY, START and END false,
//! so that a model that keeps state per row leaves that row's state alone. One batch runs at a
//! time: a sequence's next request needs its previous answer anyway.

use std::collections::VecDeque;
use std::sync::Arc;
use std::time::Duration;

use sheaf_backend::Tensor;
use tokio::sync::{mpsc, oneshot};

use crate::batcher::timer::Timer;
use crate::batcher::{Admission, Batcher};
use crate::stages::Receipt;
use crate::InferError;

/// A request's outputs, with the account of its batch.
pub type Answer = Result<(Vec<Tensor>, Option<Receipt>), InferError>;

/// How a filler row's tensor is made from a ready row's tensor for model input `i`.
pub type Filler = Arc<dyn Fn(usize, &Tensor) -> Result<Tensor, InferError> + Send + Sync>;

struct Row {
    slot: usize,
    inputs: Vec<Tensor>,
    admission: Admission,
    reply: oneshot::Sender<Answer>,
}

/// The slots of one instance.
pub struct Slots {
    rows: mpsc::UnboundedSender<Row>,
}

impl Slots {
    /// Starts the gathering task of an instance with `slots` rows. `open` says how many
    /// sequences the instance holds now (the rows worth waiting for).
    pub fn start(
        batcher: Batcher,
        slots: usize,
        delay: Duration,
        batching: bool,
        open: Arc<dyn Fn() -> usize + Send + Sync>,
        filler: Filler,
    ) -> Slots {
        let (tx, rx) = mpsc::unbounded_channel();
        tokio::spawn(gather(Gather {
            batcher,
            rows: rx,
            ready: (0..slots.max(1)).map(|_| VecDeque::new()).collect(),
            delay,
            batching,
            open,
            filler,
        }));
        Slots { rows: tx }
    }

    /// Runs a sequence's request (the model's inputs, one item) at row `slot`.
    pub async fn run(&self, slot: usize, inputs: Vec<Tensor>, admission: Admission) -> Answer {
        let (reply, answer) = oneshot::channel();
        self.rows
            .send(Row {
                slot,
                inputs,
                admission,
                reply,
            })
            .map_err(|_| InferError::internal("the model's sequence slots have stopped"))?;
        answer.await.map_err(|_| {
            InferError::internal("the model's sequence slots stopped before answering")
        })?
    }
}

struct Gather {
    batcher: Batcher,
    rows: mpsc::UnboundedReceiver<Row>,
    /// Per slot, its requests in arrival order (more than one only when a client gave up on
    /// one and its sequence sent the next).
    ready: Vec<VecDeque<Row>>,
    delay: Duration,
    batching: bool,
    open: Arc<dyn Fn() -> usize + Send + Sync>,
    filler: Filler,
}

impl Gather {
    fn place(&mut self, row: Row) {
        match self.ready.get_mut(row.slot) {
            Some(q) => q.push_back(row),
            None => {
                let _ = row.reply.send(Err(InferError::internal(format!(
                    "sequence slot {} is out of range",
                    row.slot
                ))));
            }
        }
    }

    /// Slots with a request whose client still waits; requests given up on are dropped.
    fn ready_slots(&mut self) -> usize {
        for q in &mut self.ready {
            while q.front().is_some_and(|r| r.reply.is_closed()) {
                q.pop_front();
            }
        }
        self.ready.iter().filter(|q| !q.is_empty()).count()
    }
}

async fn gather(mut g: Gather) {
    // The delay is the configuration's, kept to the microsecond.
    let mut timer = Timer::new(true);
    loop {
        if g.ready_slots() == 0 {
            match g.rows.recv().await {
                Some(row) => g.place(row),
                None => return,
            }
        }
        let deadline = tokio::time::Instant::now() + g.delay;
        while g.ready_slots() < (g.open)() {
            tokio::select! {
                row = g.rows.recv() => match row {
                    Some(row) => g.place(row),
                    None => break,
                },
                () = timer.until(Some(deadline)) => break,
            }
        }
        while let Ok(row) = g.rows.try_recv() {
            g.place(row);
        }
        if g.ready_slots() > 0 {
            run_batch(&mut g).await;
        }
    }
}

/// Runs the front request of every ready slot as one batch, each at its slot's row.
async fn run_batch(g: &mut Gather) {
    let Some(first) = g.ready.iter().position(|q| !q.is_empty()) else {
        return;
    };
    if !g.batching {
        // One slot, and no batch dimension to stack along: the request runs as it is.
        if let Some(row) = g.ready[first].pop_front() {
            let answer = g.batcher.submit(row.inputs, 1, row.admission).await;
            let _ = row.reply.send(answer.map(|a| (a.outputs, Some(a.receipt))));
        }
        return;
    }
    // Rows whose inputs are shaped like the first one's share this batch; others wait.
    let shapes: Vec<Vec<usize>> = g.ready[first][0]
        .inputs
        .iter()
        .map(|t| t.shape().to_vec())
        .collect();
    let mut taken: Vec<Option<Row>> = Vec::with_capacity(g.ready.len());
    for q in &mut g.ready {
        let fits = q.front().is_some_and(|r| {
            r.inputs.len() == shapes.len()
                && r.inputs.iter().zip(&shapes).all(|(t, s)| t.shape() == s)
        });
        taken.push(if fits { q.pop_front() } else { None });
    }
    let rows = taken.iter().rposition(Option::is_some).map_or(0, |i| i + 1);
    let admission = taken
        .iter()
        .flatten()
        .map(|r| r.admission.clone())
        .min_by_key(|a| a.level)
        .unwrap_or_default();
    let batch = assemble(&taken[..rows], &g.filler);
    let answer = match batch {
        Ok(inputs) => g.batcher.submit(inputs, rows, admission).await,
        Err(e) => Err(e),
    };
    for (i, row) in taken.into_iter().enumerate() {
        let Some(row) = row else { continue };
        let mine = match &answer {
            Ok(a) => Ok((
                a.outputs.iter().map(|t| t.slice_items(i, 1)).collect(),
                Some(a.receipt.clone()),
            )),
            Err(e) => Err(e.clone()),
        };
        let _ = row.reply.send(mine);
    }
}

/// The batch's inputs: per model input, the rows stacked in slot order, fillers between.
fn assemble(rows: &[Option<Row>], filler: &Filler) -> Result<Vec<Tensor>, InferError> {
    let model = rows
        .iter()
        .flatten()
        .next()
        .ok_or_else(|| InferError::internal("a batch without rows"))?;
    let mut inputs = Vec::with_capacity(model.inputs.len());
    for (i, like) in model.inputs.iter().enumerate() {
        let fill = filler(i, like)?;
        let parts: Vec<Tensor> = rows
            .iter()
            .map(|r| {
                r.as_ref()
                    .map_or_else(|| fill.clone(), |r| r.inputs[i].clone())
            })
            .collect();
        inputs.push(Tensor::concat(&parts)?);
    }
    Ok(inputs)
}
