export function memcheckView() { throw new Error('not yet'); }
