// Package racehook holds the points at which tests make another writer act
// in the middle of a compare-and-replace of pkg/install/nodefile. Each is
// nil outside tests; only the installer's packages can reach them.
package racehook

// BeforeCompare runs in nodefile.ReplaceIfUnchanged once the new content
// is written and synced, before the file is compared with what the caller
// read; AfterCompare runs between the compare and the swap.
var BeforeCompare, AfterCompare func(path string)

// BeforeRemoveIfUnchanged runs when nodefile.RemoveIfUnchanged is called,
// after its caller read the file.
var BeforeRemoveIfUnchanged func(path string)
