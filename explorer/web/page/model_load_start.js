// The header's Load model (and the Model tab's Load): the loading line shows at once, before the server answers.
(name) => { if (window.explorerLoading) window.explorerLoading(name || 'the model'); }
