//! The baseline page allocator: a bitmap scanned linearly for the first run of free pages,
//! a word at a time past fully used words. This is the allocator a segment tree must beat.

pub struct BitmapFirstFit {
    /// Bit set = page in use.
    words: Vec<u64>,
    pages: u32,
}

impl BitmapFirstFit {
    pub fn new(pages: u32) -> Self {
        let mut words = vec![0u64; (pages as usize).div_ceil(64)];
        // Pages past the end are marked used so that no run reaches them.
        let tail = pages % 64;
        if tail != 0 {
            *words.last_mut().expect("at least one word") = !0u64 << tail;
        }
        Self { words, pages }
    }

    fn used(&self, page: u32) -> bool {
        self.words[(page / 64) as usize] >> (page % 64) & 1 == 1
    }

    fn set(&mut self, start: u32, len: u32, used: bool) {
        for page in start..start + len {
            let (word, bit) = ((page / 64) as usize, page % 64);
            if used {
                self.words[word] |= 1 << bit;
            } else {
                self.words[word] &= !(1 << bit);
            }
        }
    }

    /// The first run of `len` free pages, marked used; its start.
    pub fn alloc(&mut self, len: u32) -> Option<u32> {
        let mut page = 0;
        let mut run = 0;
        while page < self.pages {
            if page % 64 == 0 && run == 0 && self.words[(page / 64) as usize] == !0 {
                page += 64;
                continue;
            }
            if self.used(page) {
                run = 0;
            } else {
                run += 1;
                if run == len {
                    let start = page + 1 - len;
                    self.set(start, len, true);
                    return Some(start);
                }
            }
            page += 1;
        }
        None
    }

    /// Marks `len` pages from `start` used.
    pub fn occupy(&mut self, start: u32, len: u32) {
        self.set(start, len, true);
    }

    pub fn free(&mut self, start: u32, len: u32) {
        self.set(start, len, false);
    }
}
